//! `Status` error bodies as the API server writes them (`k8s.io/apimachinery/pkg/api/errors`):
//! `kind: Status`, `apiVersion: v1`, `status: Failure`, a `reason`, the HTTP `code`, a `message`
//! worded as the real server words it, and `details` naming the object where the server names it.

use serde_json::{Value, json};

use super::resources::ResourceType;

/// An API error: the HTTP status code and the `Status` body that goes with it.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub code: u16,
    pub reason: &'static str,
    pub message: String,
    pub details: Option<Value>,
}

impl ApiError {
    fn named(
        code: u16,
        reason: &'static str,
        res: &ResourceType,
        name: &str,
        message: String,
    ) -> Self {
        let mut details = json!({ "name": name, "kind": res.plural });
        if !res.group.is_empty() {
            details["group"] = json!(res.group);
        }
        Self {
            code,
            reason,
            message,
            details: Some(details),
        }
    }

    /// 404 `pods "x" not found`.
    pub fn not_found(res: &ResourceType, name: &str) -> Self {
        Self::named(
            404,
            "NotFound",
            res,
            name,
            format!("{} \"{name}\" not found", res.qualified()),
        )
    }

    /// 409 `pods "x" already exists`.
    pub fn already_exists(res: &ResourceType, name: &str) -> Self {
        Self::named(
            409,
            "AlreadyExists",
            res,
            name,
            format!("{} \"{name}\" already exists", res.qualified()),
        )
    }

    /// 409 `Operation cannot be fulfilled on pods "x": <why>`.
    pub fn conflict(res: &ResourceType, name: &str, why: &str) -> Self {
        Self::named(
            409,
            "Conflict",
            res,
            name,
            format!(
                "Operation cannot be fulfilled on {} \"{name}\": {why}",
                res.qualified()
            ),
        )
    }

    /// 409 for a write that carried a stale `metadata.resourceVersion`.
    pub fn stale(res: &ResourceType, name: &str) -> Self {
        Self::conflict(
            res,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        )
    }

    /// 422 `Pod "x" is invalid: field: Required value: ...`.
    pub fn invalid(res: &ResourceType, name: &str, field: &str, why: &str) -> Self {
        let mut err = Self::named(
            422,
            "Invalid",
            res,
            name,
            format!("{} \"{name}\" is invalid: {field}: {why}", res.kind),
        );
        if let Some(details) = err.details.as_mut() {
            details["kind"] = json!(res.kind);
            details["causes"] =
                json!([{ "reason": "FieldValueRequired", "message": why, "field": field }]);
        }
        err
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self {
            code: 400,
            reason: "BadRequest",
            message: message.into(),
            details: None,
        }
    }

    /// 404 for a path that names no resource this server serves.
    pub fn no_route() -> Self {
        Self {
            code: 404,
            reason: "NotFound",
            message: "the server could not find the requested resource".into(),
            details: Some(json!({})),
        }
    }

    pub fn method_not_allowed() -> Self {
        Self {
            code: 405,
            reason: "MethodNotAllowed",
            message: "the server does not allow this method on the requested resource".into(),
            details: Some(json!({})),
        }
    }

    pub fn unsupported_media_type(content_type: &str) -> Self {
        Self {
            code: 415,
            reason: "UnsupportedMediaType",
            message: format!(
                "the body of the request was in an unknown format ({content_type}) - accepted media types include: \
                 application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml, \
                 application/strategic-merge-patch+json"
            ),
            details: None,
        }
    }

    /// 429 as the eviction subresource answers when a PodDisruptionBudget forbids the eviction
    /// (`pkg/registry/core/pod/storage/eviction.go`).
    pub fn disruption_budget(budget: &str) -> Self {
        Self {
            code: 429,
            reason: "TooManyRequests",
            message: "Cannot evict pod as it would violate the pod's disruption budget.".into(),
            details: Some(json!({
                "causes": [{
                    "reason": "DisruptionBudget",
                    "message": format!("The disruption budget {budget} needs 1 healthy pods and has 1 currently"),
                }],
            })),
        }
    }

    /// 410 `Expired`: the watch cache no longer holds the requested resourceVersion.
    pub fn expired(requested: u64, oldest: u64) -> Self {
        Self {
            code: 410,
            reason: "Expired",
            message: format!("too old resource version: {requested} ({oldest})"),
            details: None,
        }
    }

    pub fn unavailable() -> Self {
        Self {
            code: 503,
            reason: "ServiceUnavailable",
            message: "the server is currently unable to handle the request".into(),
            details: None,
        }
    }

    /// 429 `TooManyRequests` (priority and fairness shedding a request) or 503
    /// `ServiceUnavailable`, each with `details.retryAfterSeconds` as the server sets it beside
    /// its `Retry-After` header.
    pub fn throttled(code: u16, retry_after: u32) -> Self {
        let (reason, message) = if code == 429 {
            (
                "TooManyRequests",
                "Too many requests, please try again later.".into(),
            )
        } else {
            let unavailable = Self::unavailable();
            (unavailable.reason, unavailable.message)
        };
        Self {
            code,
            reason,
            message,
            details: Some(json!({ "retryAfterSeconds": retry_after })),
        }
    }

    /// The `Status` object sent as the response body or inside a watch `ERROR` event.
    pub fn body(&self) -> Value {
        let mut status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if let Some(details) = &self.details {
            status["details"] = details.clone();
        }
        status
    }
}

/// The `Status` a successful operation without an object to return answers with (eviction).
pub fn success(code: u16) -> Value {
    json!({ "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": code })
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}: {}", self.code, self.reason, self.message)
    }
}

impl std::error::Error for ApiError {}
