//! TokenReview (authentication.k8s.io/v1) and SubjectAccessReview (authorization.k8s.io/v1),
//! answered from a table the test sets ([`super::FakeApi::add_token`],
//! [`super::FakeApi::allow`]): a token in the table is authenticated as its user, any other is
//! not; an access review is allowed when an entry names its user and every field of the entry's
//! attributes equals the review's. Nothing else of the real authenticators and authorizers
//! (groups in rules, audiences, expiry) is modelled. Each review answers 201 with the review and
//! its `status`, as the real server does.

use std::collections::HashMap;

use serde_json::{Value, json};

use super::status::ApiError;

pub const TOKEN_REVIEWS: &str = "/apis/authentication.k8s.io/v1/tokenreviews";
pub const ACCESS_REVIEWS: &str = "/apis/authorization.k8s.io/v1/subjectaccessreviews";

/// What the reviews answer.
#[derive(Debug, Default)]
pub struct Reviews {
    /// Token -> `UserInfo`.
    pub tokens: HashMap<String, Value>,
    /// (username, attributes): e.g. `{"nonResourceAttributes": {"path": "/metrics", "verb":
    /// "get"}}`.
    pub allowed: Vec<(String, Value)>,
}

/// Whether every field of `want` (recursively) is in `got` with the same value.
fn within(want: &Value, got: &Value) -> bool {
    match (want, got) {
        (Value::Object(w), Value::Object(g)) => w
            .iter()
            .all(|(k, v)| g.get(k).is_some_and(|gv| within(v, gv))),
        _ => want == got,
    }
}

/// The answer to a POST of `body` to `path`, when `path` is one of the reviews.
pub fn answer(
    reviews: &Reviews,
    path: &str,
    body: Option<Value>,
) -> Option<Result<Value, ApiError>> {
    let review = |kind: &str| -> Result<Value, ApiError> {
        let body = body.clone().unwrap_or_default();
        if body["kind"] != kind || !body["spec"].is_object() {
            return Err(ApiError::bad_request(format!("not a {kind}")));
        }
        Ok(body)
    };
    match path {
        TOKEN_REVIEWS => Some(review("TokenReview").map(|mut r| {
            let user = r["spec"]["token"]
                .as_str()
                .and_then(|t| reviews.tokens.get(t));
            r["status"] = match user {
                Some(user) => json!({"authenticated": true, "user": user}),
                None => json!({"authenticated": false, "error": "invalid bearer token"}),
            };
            r
        })),
        ACCESS_REVIEWS => Some(review("SubjectAccessReview").map(|mut r| {
            let spec = &r["spec"];
            let allowed = reviews.allowed.iter().any(|(user, attributes)| {
                spec["user"].as_str() == Some(user.as_str()) && within(attributes, spec)
            });
            r["status"] = json!({"allowed": allowed});
            r
        })),
        _ => None,
    }
}
