//! One typed description per task kind: its stored name, its title, what its tools say, its
//! parameter type (with defaults, bounds and validation) and its result type.
//!
//! Everything else is derived from these descriptions: the server registers a kind once and
//! gets its `start_{name}` tool and its task-only `run_{name}` tool with the parameter type's
//! JSON schema; the CLI builds `task start <name> --field value` and the dashboard its start
//! forms from that schema (see [`crate::form`]), so a new kind needs no change in either.

mod batch;
mod migration;
mod processing;
mod training;
mod trip;

use std::fmt;

use schemars::JsonSchema;
use serde::Serialize;
use serde::de::DeserializeOwned;

pub use batch::{BatchParams, BatchProcessing};
pub use migration::{DataMigration, MigrationParams};
pub use processing::{DataProcessing, ProcessingParams};
pub use training::{MlTraining, TrainingParams};
pub use trip::{CHOOSE_HOTEL, CONFIRM_BOOKING, TripParams, TripPlanning};

pub const DATA_MIGRATION: &str = DataMigration::NAME;
pub const BATCH_PROCESSING: &str = BatchProcessing::NAME;
pub const ML_TRAINING: &str = MlTraining::NAME;
pub const TRIP_PLANNING: &str = TripPlanning::NAME;
/// The in-request job of `resumable_data_processing`.
pub const DATA_PROCESSING: &str = DataProcessing::NAME;

/// How a kind's work is offered to MCP clients.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Offer {
    /// In the background: a `start_{name}` tool that answers with a `task://status` link at
    /// once, and a `run_{name}` tool that runs only as an MCP task.
    Background,
    /// Inside a tool call of its own, written by hand (`resumable_data_processing`).
    InRequest,
}

/// The description of a task kind. The server's `TaskKind` extends it with how to plan and step.
pub trait KindSpec: Send + Sync + 'static {
    /// The stored name (`snake_case`); tool names and the CLI's subcommand derive from it.
    const NAME: &'static str;
    /// What people call it ("Batch processing"): tool titles, dashboard tabs and tables.
    const TITLE: &'static str;
    /// The `start_{name}` tool's description: what the task does and what it answers.
    const DESCRIPTION: &'static str;
    /// What the completed task's result holds, completing "the task's result is …".
    const RESULT: &'static str;
    const OFFER: Offer = Offer::Background;

    /// The parameters. Their JSON schema (doc comments, `#[schemars(range)]`, serde defaults) is
    /// the tools' input schema and the source of every form.
    type Params: Serialize + DeserializeOwned + JsonSchema + Send + Sync + 'static;
    type Output: Serialize + DeserializeOwned + Send + 'static;

    /// Checks what the schema cannot say (or clients may not enforce), naming the field.
    fn validate(_params: &Self::Params) -> Result<(), ParamError> {
        Ok(())
    }
}

/// The tool that runs the data-processing kind inside the call (its `OFFER` is `InRequest`).
pub const PROCESSING_TOOL: &str = "resumable_data_processing";

/// The plain-call tool of a background kind.
pub fn start_tool(kind: &str) -> String {
    format!("start_{kind}")
}

/// The task-only tool of a background kind.
pub fn task_tool(kind: &str) -> String {
    format!("run_{kind}")
}

/// The kind a `start_{name}` tool starts.
pub fn kind_of_start_tool(tool: &str) -> Option<&str> {
    tool.strip_prefix("start_")
}

/// Invalid parameters, and the field they are about when there is one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct ParamError {
    /// The parameter's name (a dotted path for nested ones); `None` when no single field is at
    /// fault.
    pub field: Option<String>,
    /// The whole explanation, naming the field and what is allowed.
    pub message: String,
}

impl ParamError {
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        ParamError {
            field: Some(field.into()),
            message: message.into(),
        }
    }

    /// An error about the parameters as a whole.
    pub fn general(message: impl Into<String>) -> Self {
        ParamError {
            field: None,
            message: message.into(),
        }
    }
}

impl fmt::Display for ParamError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for ParamError {}

/// Reads parameters from JSON, naming the field a type error or a missing field is about.
pub fn parse_params<P: DeserializeOwned>(
    kind: &str,
    value: serde_json::Value,
) -> Result<P, ParamError> {
    // Serde reads a struct from an array too (positionally) and names no field for a string or
    // a number: parameters are named, so anything but an object is refused as a whole here.
    let found = match &value {
        serde_json::Value::Object(_) => None,
        serde_json::Value::Null => Some("null"),
        serde_json::Value::Bool(_) => Some("a boolean"),
        serde_json::Value::Number(_) => Some("a number"),
        serde_json::Value::String(_) => Some("a string"),
        serde_json::Value::Array(_) => Some("an array"),
    };
    if let Some(found) = found {
        return Err(ParamError::general(format!(
            "invalid parameters for {kind}: expected a JSON object of named parameters, got {found}"
        )));
    }
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        // "total_items: invalid type: …": the path leads, except for errors at the root.
        let explained = e.to_string();
        let inner = e.into_inner().to_string();
        // A missing field is reported at its parent, with the name in backticks.
        let field = if path == "." {
            inner
                .strip_prefix("missing field `")
                .and_then(|rest| rest.split_once('`'))
                .map(|(name, _)| name.to_owned())
        } else {
            Some(path)
        };
        ParamError {
            field,
            message: format!("invalid parameters for {kind}: {explained}"),
        }
    })
}

/// The JSON schema of a parameter type as MCP tools declare it (draft 2020-12, root `object`,
/// without the type's own title and description).
pub fn params_schema<P: JsonSchema>() -> serde_json::Map<String, serde_json::Value> {
    let schema = schemars::generate::SchemaSettings::draft2020_12()
        .into_generator()
        .into_root_schema_for::<P>();
    let mut object = match serde_json::to_value(schema) {
        Ok(serde_json::Value::Object(object)) => object,
        _ => serde_json::Map::new(),
    };
    object.remove("title");
    object.remove("description");
    object
}

/// Checks that `value` of `field` lies in `min..=max`, with a message naming both.
pub fn check_range<T: PartialOrd + fmt::Display>(
    field: &str,
    value: T,
    min: T,
    max: T,
) -> Result<(), ParamError> {
    if value < min || value > max {
        return Err(ParamError::new(
            field,
            format!("{field} must be between {min} and {max}, got {value}"),
        ));
    }
    Ok(())
}

/// Checks that text `field` has between `min` and `max` characters.
pub fn check_length(field: &str, value: &str, min: usize, max: usize) -> Result<(), ParamError> {
    let length = value.chars().count();
    if length < min || length > max {
        return Err(ParamError::new(
            field,
            format!("{field} length must be between {min} and {max}, got {length}"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn range_errors_name_the_field_and_bounds() {
        assert_eq!(
            check_range("batch_size", 0, 1, 100).unwrap_err(),
            ParamError::new("batch_size", "batch_size must be between 1 and 100, got 0")
        );
        assert!(check_range("batch_size", 100, 1, 100).is_ok());
        assert_eq!(
            check_length("model_name", "", 1, 100)
                .unwrap_err()
                .field
                .as_deref(),
            Some("model_name")
        );
    }

    #[test]
    fn parse_errors_name_the_field() {
        let missing =
            parse_params::<BatchParams>(BATCH_PROCESSING, serde_json::json!({"batch_size": 1}))
                .unwrap_err();
        assert_eq!(missing.field.as_deref(), Some("total_items"));
        assert!(
            missing.message.contains("missing field `total_items`"),
            "{missing}"
        );
        let wrong = parse_params::<BatchParams>(
            BATCH_PROCESSING,
            serde_json::json!({"batch_size": "ten", "total_items": 5}),
        )
        .unwrap_err();
        assert_eq!(wrong.field.as_deref(), Some("batch_size"));
        assert!(
            wrong.message.contains("invalid type: string \"ten\""),
            "{wrong}"
        );
    }

    /// Regression (found by the `tool_arguments` fuzz target): parameters that are not a JSON
    /// object were mishandled: an array was read positionally as if it named the fields in
    /// declaration order, and other values got serde's error about the whole struct.
    #[test]
    fn parameters_that_are_not_an_object_are_refused_as_a_whole() {
        for (value, found) in [
            (serde_json::json!([5, 1]), "an array"),
            (serde_json::json!(null), "null"),
            (serde_json::json!("total_items"), "a string"),
            (serde_json::json!(5), "a number"),
            (serde_json::json!(true), "a boolean"),
        ] {
            let error = parse_params::<BatchParams>(BATCH_PROCESSING, value.clone()).unwrap_err();
            assert_eq!(
                error,
                ParamError::general(format!(
                    "invalid parameters for {BATCH_PROCESSING}: expected a JSON object of named \
                     parameters, got {found}"
                )),
                "{value}"
            );
        }
    }

    #[test]
    fn schemas_are_objects_without_the_type_doc() {
        let schema = params_schema::<TrainingParams>();
        assert_eq!(schema["type"], "object");
        assert!(!schema.contains_key("title"));
        assert_eq!(schema["required"], serde_json::json!(["model_name"]));
        assert_eq!(schema["properties"]["epochs"]["default"], 100);
    }

    #[test]
    fn tool_names_derive_from_the_kind() {
        assert_eq!(start_tool(BATCH_PROCESSING), "start_batch_processing");
        assert_eq!(task_tool(ML_TRAINING), "run_ml_training");
        assert_eq!(
            kind_of_start_tool("start_data_migration"),
            Some(DATA_MIGRATION)
        );
        assert_eq!(kind_of_start_tool("cancel_task"), None);
    }
}
