//! Arbitrary JSON arguments for every tool the server lists (`start_{kind}`, `run_{kind}` and
//! the hand-written ones), called through the real router in the harness's session, and for
//! every registered kind through `Engine::start` directly: each is decoded to a result or a
//! clear error (a tool error or invalid params with a message), never a panic, an internal
//! error or a 5xx; arguments that are not a JSON object are refused by name.
#![no_main]

use std::sync::OnceLock;

use durable_mcp_fuzz::{post, server};
use durable_mcp_server::engine::EngineError;
use libfuzzer_sys::arbitrary::{self, Arbitrary, Unstructured};
use libfuzzer_sys::fuzz_target;
use serde_json::{Map, Value, json};

/// Every tool's name and the names of its parameters (from its input schema), so that inputs
/// can name real fields.
struct Tools {
    names: Vec<String>,
    fields: Vec<String>,
    kinds: Vec<&'static str>,
}

fn tools() -> &'static Tools {
    static TOOLS: OnceLock<Tools> = OnceLock::new();
    TOOLS.get_or_init(|| {
        let server = server();
        let list = r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#;
        let answer = server.send(post(list, Some(&server.session)), true);
        let messages = answer.messages();
        let tools = messages
            .iter()
            .find_map(|m| m["result"]["tools"].as_array())
            .expect("tools/list answers");
        let mut names = Vec::new();
        let mut fields = Vec::new();
        for tool in tools {
            names.push(tool["name"].as_str().expect("a tool name").to_owned());
            if let Some(properties) = tool["inputSchema"]["properties"].as_object() {
                fields.extend(properties.keys().cloned());
            }
        }
        fields.sort();
        fields.dedup();
        let kinds = server.engine.kinds().iter().map(|kind| kind.name).collect();
        Tools {
            names,
            fields,
            kinds,
        }
    })
}

/// A JSON value whose object keys are mostly real parameter names.
#[derive(Debug)]
struct Json(Value);

impl<'a> Arbitrary<'a> for Json {
    fn arbitrary(u: &mut Unstructured<'a>) -> arbitrary::Result<Self> {
        json_value(u, 0).map(Json)
    }
}

fn json_value(u: &mut Unstructured<'_>, depth: u32) -> arbitrary::Result<Value> {
    let choice = if depth > 3 {
        u.int_in_range(0..=5)?
    } else {
        u.int_in_range(0..=7)?
    };
    Ok(match choice {
        0 => Value::Null,
        1 => Value::Bool(u.arbitrary()?),
        2 => json!(u.arbitrary::<i64>()?),
        3 => json!(u.arbitrary::<u64>()?),
        4 => serde_json::Number::from_f64(u.arbitrary()?).map_or(Value::Null, Value::Number),
        5 => Value::String(u.arbitrary()?),
        6 => {
            let len = u.int_in_range(0..=4)?;
            Value::Array(
                (0..len)
                    .map(|_| json_value(u, depth + 1))
                    .collect::<arbitrary::Result<_>>()?,
            )
        }
        _ => {
            let len = u.int_in_range(0..=6)?;
            let mut object = Map::new();
            for _ in 0..len {
                let key = if u.ratio(1, 8)? {
                    u.arbitrary::<String>()?
                } else {
                    u.choose(&tools().fields)?.clone()
                };
                object.insert(key, json_value(u, depth + 1)?);
            }
            Value::Object(object)
        }
    })
}

#[derive(Debug, Arbitrary)]
struct Input {
    tool: u8,
    arguments: Json,
    /// Whether the call is task-augmented (the 2025-11-25 shape).
    as_task: bool,
}

fuzz_target!(|input: Input| {
    let server = server();
    let tools = tools();
    let name = &tools.names[input.tool as usize % tools.names.len()];
    let mut params = json!({"name": name, "arguments": input.arguments.0});
    if input.as_task {
        params["task"] = json!({});
    }
    let call = json!({"jsonrpc": "2.0", "id": 9, "method": "tools/call", "params": params});
    let answer = server.send(post(&call.to_string(), Some(&server.session)), true);
    assert!(
        !answer.status.is_server_error(),
        "{call} got {}: {:?}",
        answer.status,
        answer.body
    );
    for message in answer.messages() {
        if let Some(error) = message.get("error") {
            assert_ne!(
                error["code"], -32603,
                "{call} got an internal error: {error}"
            );
            assert!(
                error["message"].as_str().is_some_and(|m| !m.is_empty()),
                "{call} got an error without a message: {error}"
            );
        }
        if message["result"]["isError"] == true {
            let text = message["result"]["content"][0]["text"].as_str();
            assert!(
                text.is_some_and(|t| !t.is_empty()),
                "{call} got a tool error without a message: {message}"
            );
        }
    }

    // The engine's own decoding, for every kind, of any JSON value.
    let kind = tools.kinds[input.tool as usize % tools.kinds.len()];
    let arguments = input.arguments.0;
    let started = server
        .runtime
        .block_on(server.engine.start(kind, "fuzz", arguments.clone()));
    match started {
        Ok(_) => assert!(arguments.is_object(), "{kind} accepted {arguments}"),
        Err(EngineError::InvalidParams(e)) => {
            assert!(
                !e.message.is_empty(),
                "{kind}: {arguments} refused without a message"
            );
        }
        Err(EngineError::TooManyTasks { .. }) => {}
        Err(e) => panic!("{kind}: {arguments} got {e}"),
    }
    server.cancel_unfinished();
});
