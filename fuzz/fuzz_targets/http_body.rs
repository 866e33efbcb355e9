//! Arbitrary POST bodies to `/mcp` of the real router, outside any session and inside the
//! harness's live one: never a 5xx, and a body that is not JSON is a 400 with the JSON-RPC parse
//! error (-32700).
#![no_main]

use axum::http::StatusCode;
use durable_mcp_fuzz::{post, server};
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

fuzz_target!(|data: &[u8]| {
    let Some((&mode, body)) = data.split_first() else {
        return;
    };
    let server = server();
    let session = (mode & 1 == 1).then_some(server.session.as_str());
    let mut request = post("", session);
    *request.body_mut() = body.to_vec().into();
    let answer = server.send(request, true);
    assert!(
        !answer.status.is_server_error(),
        "{:?} got {}: {:?}",
        String::from_utf8_lossy(body),
        answer.status,
        answer.body
    );
    if serde_json::from_slice::<Value>(body).is_err() {
        assert_eq!(
            answer.status,
            StatusCode::BAD_REQUEST,
            "{:?}",
            String::from_utf8_lossy(body)
        );
        let messages = answer.messages();
        assert_eq!(
            messages.first().map(|m| m["error"]["code"].clone()),
            Some((-32700).into()),
            "{:?} got {:?}",
            String::from_utf8_lossy(body),
            answer.body
        );
    }
    server.forget_new_session(&answer);
    // A body may start tasks (tools/call, task-augmented or not): stop them.
    if body.windows(5).any(|w| w == b"tools") {
        server.cancel_unfinished();
    }
});
