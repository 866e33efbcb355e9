//! Command-line flags read from a tool's input schema: `--batch-size 10` for a `batch_size`
//! property, with its title, description, default and bounds in `--help`, and the value sent as
//! the property's JSON type.
//!
//! The flags after `task start KIND` (or `process`) are parsed in two passes: first only the
//! client's own flags (`--server`, `--state-file`, `--token`, `--protocol`), which are needed to
//! reach the server, then, with the tool's schema in hand, everything.

use clap::{ArgAction, Args, Command, ValueEnum};
use durable_shared::form::{FormField, Input, fields};
use serde_json::{Map, Value};

use crate::args::{ClientArgs, Protocol};

/// The client flags among `arguments` (those after the kind), over the ones given before it.
///
/// Scanned by hand: this runs before the schema that gives the other flags is known, and clap
/// cannot pick out some flags while leaving unknown ones alone (`ignore_errors` stops at the
/// first unknown flag). The second pass checks the whole line again with clap.
pub fn client_flags(before: &ClientArgs, arguments: &[String]) -> ClientArgs {
    let mut flags = before.clone();
    let mut tokens = arguments.iter();
    while let Some(token) = tokens.next() {
        let (name, inline) = match token.split_once('=') {
            Some((name, value)) => (name, Some(value.to_owned())),
            None => (token.as_str(), None),
        };
        let mut value = || inline.clone().or_else(|| tokens.next().cloned());
        match name {
            "--server" => flags.server = value().unwrap_or(flags.server),
            "--state-file" => flags.state_file = value().map(Into::into).or(flags.state_file),
            "--token" => flags.token = value().or(flags.token),
            "--json" => flags.json = true,
            "--protocol" => {
                flags.protocol = value()
                    .and_then(|name| Protocol::from_str(&name, false).ok())
                    .unwrap_or(flags.protocol)
            }
            _ => {}
        }
    }
    flags
}

/// What the second pass found: the tool's arguments, and `--watch` (the client flags were
/// taken by the first pass).
pub struct Parsed {
    pub arguments: Map<String, Value>,
    pub watch: bool,
}

/// Parses `arguments` against `schema`, skipping the properties in `skip` (the client sets
/// them itself). Help and usage errors come back as clap errors, for the caller to print.
pub fn parse(
    name: &str,
    about: &str,
    schema: &Map<String, Value>,
    skip: &[&str],
    arguments: &[String],
) -> Result<Parsed, clap::Error> {
    let fields = fields(schema, skip);
    let mut command = Command::new(name.to_owned())
        .about(about.to_owned())
        .no_binary_name(true)
        .arg(
            clap::Arg::new("watch")
                .long("watch")
                .action(ArgAction::SetTrue)
                .help("Follow the task to its end, like `task watch`"),
        );
    command = ClientArgs::augment_args(command);
    for field in &fields {
        command = command.arg(flag(field));
    }
    let matches = command.try_get_matches_from(arguments)?;
    let mut parsed = Parsed {
        arguments: Map::new(),
        watch: matches.get_flag("watch"),
    };
    for field in &fields {
        let value = match field.input {
            Input::Boolean => matches.get_flag(&field.name).then_some(Value::Bool(true)),
            _ => matches
                .get_one::<String>(&field.name)
                .map(|typed| field.value_of(typed)),
        };
        if let Some(value) = value {
            parsed.arguments.insert(field.name.clone(), value);
        }
    }
    Ok(parsed)
}

/// The flag of one property. Defaults are not given to clap: a flag left out is not sent, and
/// the server applies its own default (shown in the help text).
fn flag(field: &FormField) -> clap::Arg {
    let mut help = field
        .description
        .clone()
        .unwrap_or_else(|| field.title.clone());
    let bounds = field.bounds();
    if !bounds.is_empty() {
        help.push_str(&format!(" [{bounds}]"));
    }
    if let Some(default) = &field.default {
        help.push_str(&format!(" [default: {}]", text(default)));
    }
    if let Input::Choice(choices) = &field.input {
        help.push_str(&format!(" [one of: {}]", choices.join(", ")));
    }
    let arg = clap::Arg::new(field.name.clone())
        .long(field.name.replace('_', "-"))
        .help(help)
        .required(field.required && field.default.is_none());
    match field.input {
        Input::Boolean => arg.action(ArgAction::SetTrue),
        Input::Integer | Input::Number => arg.value_name("NUMBER"),
        Input::Text | Input::Choice(_) => arg.value_name("TEXT"),
    }
}

fn text(value: &Value) -> String {
    match value {
        Value::String(text) => text.clone(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use durable_shared::kinds::{BatchParams, params_schema};

    use super::*;

    fn args(list: &[&str]) -> Vec<String> {
        list.iter().map(|arg| arg.to_string()).collect()
    }

    #[test]
    fn flags_follow_the_schema_and_values_keep_their_type() {
        let schema = params_schema::<BatchParams>();
        let parsed = parse(
            "batch-processing",
            "",
            &schema,
            &[],
            &args(&[
                "--batch-size",
                "5",
                "--total-items",
                "x",
                "--json",
                "--watch",
            ]),
        )
        .unwrap();
        assert_eq!(
            Value::Object(parsed.arguments),
            serde_json::json!({"batch_size": 5, "total_items": "x"})
        );
        assert!(parsed.watch);
    }

    #[test]
    fn a_missing_required_flag_is_named() {
        let schema = params_schema::<BatchParams>();
        let error = parse(
            "batch-processing",
            "",
            &schema,
            &[],
            &args(&["--batch-size", "5"]),
        )
        .err()
        .unwrap();
        assert!(error.to_string().contains("--total-items"), "{error}");
    }

    #[test]
    fn client_flags_after_the_kind_are_found_among_unknown_ones() {
        let before = ClientArgs {
            server: "http://default/mcp".into(),
            json: false,
            state_file: None,
            token: None,
            protocol: Protocol::Auto,
        };
        let flags = client_flags(
            &before,
            &args(&[
                "--batch-size",
                "5",
                "--server",
                "http://other/mcp",
                "--json",
                "--token=abc",
                "--protocol",
                "session",
            ]),
        );
        assert_eq!(flags.server, "http://other/mcp");
        assert!(flags.json);
        assert_eq!(flags.token.as_deref(), Some("abc"));
        assert_eq!(flags.protocol, Protocol::Session);
        assert_eq!(
            client_flags(&before, &args(&["--epochs", "3"])).server,
            before.server
        );
    }
}
