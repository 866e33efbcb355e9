//! Input forms read from a JSON schema: the fields of a tool's `inputSchema` (or of any object
//! schema), with their titles, defaults, examples and bounds.
//!
//! The CLI builds its `task start` flags and the dashboard its start forms from the schemas the
//! server lists in `tools/list`, which are generated from the kinds' parameter types. Neither
//! repeats a default, a bound or a field name, so a new kind appears in both by itself.

use serde_json::{Map, Value};

/// What kind of input a field takes.
#[derive(Debug, Clone, PartialEq)]
pub enum Input {
    Integer,
    Number,
    Text,
    Boolean,
    /// One of these strings.
    Choice(Vec<String>),
}

/// One property of an object schema.
#[derive(Debug, Clone, PartialEq)]
pub struct FormField {
    /// The property name, as sent in the arguments.
    pub name: String,
    /// The schema's `title`, else the name.
    pub title: String,
    pub description: Option<String>,
    pub input: Input,
    pub required: bool,
    pub default: Option<Value>,
    /// The first of the schema's `examples`.
    pub example: Option<Value>,
    pub minimum: Option<f64>,
    pub maximum: Option<f64>,
}

/// The fields of an object schema, in the schema's property order, leaving out `skip` (e.g. the
/// `client_id` a client sends on its own).
pub fn fields(schema: &Map<String, Value>, skip: &[&str]) -> Vec<FormField> {
    let required: Vec<&str> = schema
        .get("required")
        .and_then(Value::as_array)
        .map(|names| names.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let Some(properties) = schema.get("properties").and_then(Value::as_object) else {
        return Vec::new();
    };
    properties
        .iter()
        .filter(|(name, _)| !skip.contains(&name.as_str()))
        .map(|(name, property)| {
            let text = |key: &str| property.get(key).and_then(Value::as_str).map(str::to_owned);
            FormField {
                name: name.clone(),
                title: text("title").unwrap_or_else(|| name.clone()),
                description: text("description"),
                input: input_of(property),
                required: required.contains(&name.as_str()),
                default: property.get("default").cloned(),
                example: property
                    .get("examples")
                    .and_then(Value::as_array)
                    .and_then(|examples| examples.first())
                    .cloned(),
                minimum: property.get("minimum").and_then(Value::as_f64),
                maximum: property.get("maximum").and_then(Value::as_f64),
            }
        })
        .collect()
}

fn input_of(property: &Value) -> Input {
    if let Some(choices) = property.get("enum").and_then(Value::as_array) {
        return Input::Choice(
            choices
                .iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect(),
        );
    }
    // `["integer", "null"]` is an optional integer: the first non-null type decides.
    let kind = match property.get("type") {
        Some(Value::String(kind)) => kind.as_str(),
        Some(Value::Array(kinds)) => kinds
            .iter()
            .filter_map(Value::as_str)
            .find(|kind| *kind != "null")
            .unwrap_or("string"),
        _ => "string",
    };
    match kind {
        "integer" => Input::Integer,
        "number" => Input::Number,
        "boolean" => Input::Boolean,
        _ => Input::Text,
    }
}

impl FormField {
    /// What the form shows before anyone types: the default, else the example, else nothing.
    pub fn initial_text(&self) -> String {
        match self.default.as_ref().or(self.example.as_ref()) {
            Some(Value::String(text)) => text.clone(),
            Some(Value::Null) | None => String::new(),
            Some(other) => other.to_string(),
        }
    }

    /// The argument for what a person typed. Text that does not parse as the field's type is
    /// sent as typed, so the server's error names the field and what it expected.
    pub fn value_of(&self, typed: &str) -> Value {
        let trimmed = typed.trim();
        let parsed = match self.input {
            Input::Integer | Input::Number => serde_json::from_str::<Value>(trimmed)
                .ok()
                .filter(Value::is_number),
            Input::Boolean => match trimmed {
                "true" | "yes" | "on" => Some(Value::Bool(true)),
                "false" | "no" | "off" => Some(Value::Bool(false)),
                _ => None,
            },
            Input::Text | Input::Choice(_) => None,
        };
        parsed.unwrap_or_else(|| Value::String(typed.to_owned()))
    }

    /// The allowed range in words, for help texts: "1 to 100", "at least 1", "".
    pub fn bounds(&self) -> String {
        match (self.minimum, self.maximum) {
            (Some(min), Some(max)) => format!("{min} to {max}"),
            (Some(min), None) => format!("at least {min}"),
            (None, Some(max)) => format!("at most {max}"),
            (None, None) => String::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kinds::{BatchParams, MigrationParams};

    fn schema_of<T: schemars::JsonSchema>() -> Map<String, Value> {
        match serde_json::to_value(schemars::schema_for!(T)).unwrap() {
            Value::Object(schema) => schema,
            other => panic!("{other}"),
        }
    }

    #[test]
    fn fields_follow_the_parameter_type() {
        let fields = fields(&schema_of::<BatchParams>(), &[]);
        let names: Vec<&str> = fields.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, ["batch_size", "total_items", "processing_delay"]);
        let batch = &fields[0];
        assert_eq!(batch.title, "Batch size");
        assert_eq!(batch.input, Input::Integer);
        assert!(batch.required);
        assert_eq!(
            (batch.minimum, batch.maximum),
            (Some(1.0), Some(1_000_000.0))
        );
        assert_eq!(
            batch.initial_text(),
            "100",
            "the example fills a required field"
        );
        let delay = &fields[2];
        assert_eq!(delay.input, Input::Number);
        assert!(!delay.required);
        assert_eq!(delay.initial_text(), "10.0", "the serde default");
    }

    #[test]
    fn skipped_fields_are_left_out_and_text_stays_text() {
        let fields = fields(&schema_of::<MigrationParams>(), &["record_count"]);
        assert_eq!(fields.len(), 2);
        assert_eq!(fields[0].input, Input::Text);
        assert_eq!(fields[0].initial_text(), "sample:customers");
        assert_eq!(fields[0].value_of("42"), Value::String("42".into()));
    }

    #[test]
    fn typed_values_parse_or_pass_through() {
        let field = &fields(&schema_of::<BatchParams>(), &[])[0];
        assert_eq!(field.value_of(" 12 "), serde_json::json!(12));
        assert_eq!(field.value_of("ten"), serde_json::json!("ten"));
        assert_eq!(field.bounds(), "1 to 1000000");
    }
}
