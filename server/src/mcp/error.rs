//! The one place where errors become protocol answers: every failure a client can see is an
//! [`ApiError`], and this module alone decides its JSON-RPC code, its HTTP status and whether a
//! tool reports it as a tool error (which the model reads and can fix) or as a protocol error.
//!
//! Invalid parameters carry the field they are about: in a JSON-RPC error as
//! `data.field`, in a tool error as `structuredContent.field`, so a form can put the message
//! next to the right input.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use durable_shared::TaskStatus;
use durable_shared::kinds::ParamError;
use rmcp::ErrorData as McpError;
use rmcp::model::{CallToolResult, ContentBlock, ErrorCode};
use serde_json::json;

use crate::engine::{EngineError, StoreError};
use crate::telemetry;

/// A failure as a client sees it.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// Arguments the caller can fix.
    #[error("{0}")]
    InvalidParams(ParamError),
    /// A task, handle or resource that does not exist (or is not the caller's).
    #[error("{0}")]
    NotFound(String),
    /// A `task://` resource that does not exist (MCP's own resource-not-found code).
    #[error("{0}")]
    ResourceNotFound(String),
    /// A request that is valid but not in the object's current state.
    #[error("{0}")]
    Conflict(String),
    /// A method, or a way of calling a tool, that is not offered.
    #[error("{0}")]
    MethodNotFound(String),
    /// A body that is not JSON at all (JSON-RPC's parse error, HTTP 400).
    #[error("{0}")]
    Parse(String),
    /// Refused at the HTTP level (resumption, body size), with its status.
    #[error("{message}")]
    Http { status: StatusCode, message: String },
    /// The caller cancelled the request; any task it started goes on.
    #[error("{0}")]
    Cancelled(String),
    /// A limit was reached: `limit` names it (as its flag does, without the dashes).
    #[error("{message}")]
    Limit {
        limit: &'static str,
        message: String,
    },
    /// The server is stopping; ask again once it is back.
    #[error("{0}")]
    Unavailable(String),
    /// Storage failed. Logged once where it is turned into an answer; clients see no details.
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl ApiError {
    pub fn invalid(message: impl Into<String>) -> Self {
        ApiError::InvalidParams(ParamError::general(message))
    }

    /// The HTTP status of an answer that is refused before (or instead of) JSON-RPC.
    pub fn http_status(&self) -> StatusCode {
        match self {
            ApiError::Http { status, .. } => *status,
            ApiError::Store(e) if e.is_unavailable() => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Store(_) => StatusCode::INTERNAL_SERVER_ERROR,
            ApiError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::NotFound(_) | ApiError::ResourceNotFound(_) => StatusCode::NOT_FOUND,
            ApiError::Limit { .. } => StatusCode::TOO_MANY_REQUESTS,
            ApiError::Parse(_) => StatusCode::BAD_REQUEST,
            _ => StatusCode::BAD_REQUEST,
        }
    }

    /// A tool call's answer for this error: what the caller can fix is a tool error with the
    /// message (and the field), the rest a protocol error.
    pub fn into_tool_result(self) -> Result<CallToolResult, McpError> {
        let field = match &self {
            ApiError::InvalidParams(e) => e.field.clone(),
            ApiError::NotFound(_) | ApiError::ResourceNotFound(_) | ApiError::Conflict(_) => None,
            _ => return Err(self.into()),
        };
        let message = self.to_string();
        let mut result = CallToolResult::error(vec![ContentBlock::text(message.clone())]);
        result.structured_content = Some(json!({"error": message, "field": field}));
        Ok(result)
    }
}

impl From<ApiError> for McpError {
    fn from(error: ApiError) -> Self {
        match error {
            ApiError::InvalidParams(e) => {
                let data = e.field.as_ref().map(|field| json!({"field": field}));
                McpError::invalid_params(e.message, data)
            }
            ApiError::NotFound(message) | ApiError::Conflict(message) => {
                McpError::invalid_params(message, None)
            }
            ApiError::ResourceNotFound(message) => McpError::resource_not_found(message, None),
            ApiError::MethodNotFound(message) => {
                McpError::new(ErrorCode::METHOD_NOT_FOUND, message, None)
            }
            ApiError::Http { message, .. } | ApiError::Cancelled(message) => {
                McpError::invalid_request(message, None)
            }
            ApiError::Parse(message) => McpError::parse_error(message, None),
            ApiError::Limit { limit, message } => {
                McpError::invalid_request(message, Some(json!({"limit": limit})))
            }
            ApiError::Unavailable(message) => McpError::internal_error(message, None),
            ApiError::Store(e) if let Some(cause) = e.passing_cause() => {
                metrics::counter!(telemetry::STORE_ERRORS, "during" => "request").increment(1);
                tracing::warn!(
                    error = e.with_causes(),
                    "the store cannot serve a request now"
                );
                McpError::internal_error(cause, None)
            }
            ApiError::Store(e) => {
                metrics::counter!(telemetry::STORE_ERRORS, "during" => "request").increment(1);
                tracing::error!(
                    error = e.with_causes(),
                    "storage failure while serving a request"
                );
                McpError::internal_error("internal storage error; see the server log", None)
            }
        }
    }
}

impl From<EngineError> for ApiError {
    fn from(error: EngineError) -> Self {
        match error {
            EngineError::InvalidParams(e) => ApiError::InvalidParams(e),
            EngineError::UnknownKind(_) | EngineError::NotFound(_) => {
                ApiError::NotFound(error.to_string())
            }
            EngineError::InvalidState { .. } | EngineError::QuestionNotOpen(_) => {
                ApiError::Conflict(error.to_string())
            }
            EngineError::TooManyTasks { .. } => ApiError::Limit {
                limit: "max_tasks_per_owner",
                message: error.to_string(),
            },
            EngineError::Store(e) => ApiError::Store(e),
        }
    }
}

impl From<EngineError> for McpError {
    fn from(error: EngineError) -> Self {
        ApiError::from(error).into()
    }
}

impl From<StoreError> for McpError {
    fn from(error: StoreError) -> Self {
        ApiError::Store(error).into()
    }
}

impl From<ParamError> for ApiError {
    fn from(error: ParamError) -> Self {
        ApiError::InvalidParams(error)
    }
}

/// An HTTP answer with a JSON-RPC error body (`id: null`: no request was read), for refusals
/// made in front of rmcp.
impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.http_status();
        let error = McpError::from(self);
        let body = json!({"jsonrpc": "2.0", "id": null, "error": error});
        (status, axum::Json(body)).into_response()
    }
}

/// Why a task in `status` cannot be cancelled: it has ended, and an ended task never changes.
pub fn cannot_cancel(task_id: &str, status: TaskStatus) -> ApiError {
    ApiError::Conflict(format!(
        "cannot cancel task {task_id}: it is already {status}, and a finished task's status \
         never changes"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn invalid_params_carry_their_field_everywhere() {
        let error = || ApiError::InvalidParams(ParamError::new("batch_size", "batch_size is 0"));
        let rpc = McpError::from(error());
        assert_eq!(rpc.code, ErrorCode::INVALID_PARAMS);
        assert_eq!(rpc.data, Some(json!({"field": "batch_size"})));
        let tool = error().into_tool_result().unwrap();
        assert_eq!(tool.is_error, Some(true));
        assert_eq!(
            tool.structured_content,
            Some(json!({"error": "batch_size is 0", "field": "batch_size"}))
        );
    }

    #[test]
    fn storage_failures_are_protocol_errors_without_details() {
        let error = ApiError::Store(StoreError::Closed);
        assert_eq!(error.http_status(), StatusCode::INTERNAL_SERVER_ERROR);
        let rpc = error.into_tool_result().unwrap_err();
        assert_eq!(rpc.code, ErrorCode::INTERNAL_ERROR);
        assert!(!rpc.message.contains("shut down"), "{}", rpc.message);
    }

    /// A node cut off from its database answers 503 and tells the client to retry, instead of
    /// reporting an internal error.
    #[test]
    fn an_unreachable_database_is_a_retryable_unavailability() {
        let timeout = deadpool_postgres::PoolError::Timeout(deadpool_postgres::TimeoutType::Wait);
        let error = ApiError::Store(StoreError::Pool(timeout));
        assert_eq!(error.http_status(), StatusCode::SERVICE_UNAVAILABLE);
        let error = McpError::from(error);
        assert!(error.message.contains("unreachable"), "{}", error.message);
        let corrupt = ApiError::Store(StoreError::Corrupt("x".into()));
        assert_eq!(corrupt.http_status(), StatusCode::INTERNAL_SERVER_ERROR);
    }

    #[test]
    fn http_refusals_keep_their_status() {
        let error = ApiError::Http {
            status: StatusCode::GONE,
            message: "expired".into(),
        };
        assert_eq!(error.http_status(), StatusCode::GONE);
        assert_eq!(McpError::from(error).code, ErrorCode::INVALID_REQUEST);
    }
}
