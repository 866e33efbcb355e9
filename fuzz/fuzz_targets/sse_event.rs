//! The SSE parser every client of the project uses (`durable_shared::sse`) on arbitrary bytes:
//! splitting a buffer into events never loses or invents a byte, parsing never panics, and an
//! event written the way the server writes it parses back to itself.
#![no_main]

use durable_shared::sse::{SseEvent, take_event};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // Splitting: the events taken, then what is left, are exactly the input; each event ends
    // with its blank line and holds no earlier one.
    let mut buffer = data.to_vec();
    let mut rejoined = Vec::new();
    while let Some(event) = take_event(&mut buffer) {
        assert!(event.ends_with(b"\n\n"), "{event:?} does not end an event");
        assert!(
            !event[..event.len() - 1].windows(2).any(|w| w == b"\n\n"),
            "{event:?} holds two events"
        );
        rejoined.extend_from_slice(&event);
        let text = String::from_utf8_lossy(&event);
        if let Some(parsed) = SseEvent::parse(&text) {
            let _ = parsed.event_id();
            let _ = parsed.is_priming();
        }
    }
    rejoined.extend_from_slice(&buffer);
    assert_eq!(rejoined, data, "take_event lost or changed bytes");

    // Round trip: an event whose id and data hold no line break ends (data may hold `\n`,
    // written as several `data:` lines) parses back to itself.
    let text = String::from_utf8_lossy(data);
    let (id, rest) = text.split_once('\u{0}').unwrap_or(("", &text));
    let (data_field, retry) = rest.split_once('\u{0}').unwrap_or((rest, ""));
    let event = SseEvent {
        id: (!id.is_empty()).then(|| id.to_owned()),
        data: data_field.to_owned(),
        retry_ms: retry.parse().ok(),
    };
    if event
        .id
        .as_deref()
        .is_some_and(|id| id.contains(['\n', '\r']))
        || event.data.contains('\r')
    {
        return;
    }
    let mut written = String::new();
    if let Some(id) = &event.id {
        written.push_str(&format!("id: {id}\n"));
    }
    if let Some(retry) = event.retry_ms {
        written.push_str(&format!("retry: {retry}\n"));
    }
    for line in event.data.split('\n') {
        written.push_str(&format!("data: {line}\n"));
    }
    written.push('\n');
    let mut buffer = written.clone().into_bytes();
    let taken = take_event(&mut buffer).expect("a written event is complete");
    assert!(buffer.is_empty(), "{written:?} left {buffer:?}");
    assert_eq!(
        SseEvent::parse(std::str::from_utf8(&taken).unwrap()),
        Some(event),
        "{written:?} did not parse back"
    );
});
