//! The API server's side of [`crate::server::auth`]: a TokenReview (authentication.k8s.io/v1)
//! for the bearer token and a SubjectAccessReview (authorization.k8s.io/v1) for the request,
//! through the node's client, so each has the client's [`super::client::REQUEST_TIMEOUT`].
//!
//! The attributes asked about:
//! - `/metrics`: `nonResourceAttributes {path: /metrics, verb: get}`, what kube-rbac-proxy asks
//!   for node-exporter's `/metrics` (its default without `--config-file` resource attributes);
//!   the scraper's ClusterRole grants `nonResourceURLs: [/metrics]`. `/status` asked from
//!   another address than loopback: the same for `/status`.
//! - `/stats/summary`: `resourceAttributes {group: "", version: v1, resource: nodes,
//!   subresource: stats, name: NODE, verb: get}`, what the kubelet asks for its own `/stats/`
//!   paths (kubernetes `pkg/kubelet/server/auth.go`, `GetRequestAttributes`: resource `nodes`,
//!   the node's name, subresource `stats` for a path under `/stats`, the verb from the method,
//!   `get` for a GET), so whoever may read the kubelet's summary may read qoslet's.
//!
//! The TokenReview names no audiences, as kube-rbac-proxy without `--auth-token-audiences`:
//! the API server checks the token against its own (a pod's projected service account token).

use k8s_openapi::api::{
    authentication::v1::{TokenReview, TokenReviewSpec},
    authorization::v1::{
        NonResourceAttributes, ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
    },
};
use kube::{Api, Client, api::PostParams};

use crate::server::auth::{Access, ReviewError, Reviewer, User};

/// Reviews through the API server, for the node `node`.
pub(crate) struct ApiReviewer {
    pub(crate) client: Client,
    pub(crate) node: String,
}

impl ApiReviewer {
    /// The SubjectAccessReview's attributes for `access` (see the module's doc).
    pub(crate) fn spec(&self, user: &User, access: Access) -> SubjectAccessReviewSpec {
        let mut spec = SubjectAccessReviewSpec {
            user: Some(user.username.clone()),
            uid: Some(user.uid.clone()).filter(|u| !u.is_empty()),
            groups: Some(user.groups.clone()),
            extra: Some(user.extra.clone()).filter(|e| !e.is_empty()),
            ..Default::default()
        };
        match access.non_resource_path() {
            Some(path) => {
                spec.non_resource_attributes = Some(NonResourceAttributes {
                    path: Some(path.into()),
                    verb: Some("get".into()),
                });
            }
            None => {
                spec.resource_attributes = Some(ResourceAttributes {
                    group: Some(String::new()),
                    version: Some("v1".into()),
                    resource: Some("nodes".into()),
                    subresource: Some("stats".into()),
                    name: Some(self.node.clone()),
                    verb: Some("get".into()),
                    ..Default::default()
                });
            }
        }
        spec
    }
}

fn review_error(what: &str, e: &kube::Error) -> ReviewError {
    ReviewError(format!("{what}: {e}"))
}

impl Reviewer for ApiReviewer {
    fn authenticate<'a>(
        &'a self,
        token: &'a str,
    ) -> futures::future::BoxFuture<'a, Result<Option<User>, ReviewError>> {
        Box::pin(async move {
            let review = TokenReview {
                spec: TokenReviewSpec {
                    token: token.to_owned(),
                    audiences: None,
                },
                ..Default::default()
            };
            let answer = Api::<TokenReview>::all(self.client.clone())
                .create(&PostParams::default(), &review)
                .await
                .map_err(|e| review_error("TokenReview", &e))?;
            let Some(status) = answer.status.filter(|s| s.authenticated == Some(true)) else {
                return Ok(None);
            };
            let Some(user) = status.user else {
                return Ok(None);
            };
            Ok(Some(User {
                username: user.username.unwrap_or_default(),
                uid: user.uid.unwrap_or_default(),
                groups: user.groups.unwrap_or_default(),
                extra: user.extra.unwrap_or_default(),
            }))
        })
    }

    fn authorize<'a>(
        &'a self,
        user: &'a User,
        access: Access,
    ) -> futures::future::BoxFuture<'a, Result<bool, ReviewError>> {
        Box::pin(async move {
            let review = SubjectAccessReview {
                spec: self.spec(user, access),
                ..Default::default()
            };
            let answer = Api::<SubjectAccessReview>::all(self.client.clone())
                .create(&PostParams::default(), &review)
                .await
                .map_err(|e| review_error("SubjectAccessReview", &e))?;
            Ok(answer.status.is_some_and(|s| s.allowed))
        })
    }
}
