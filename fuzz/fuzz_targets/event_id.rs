//! The event id parser (`durable_shared::EventId`, what a `Last-Event-ID` header is checked
//! with) on arbitrary text: it never panics, it accepts only the canonical form the server
//! writes (so one event has one id), and every id the server can write parses back to itself.
#![no_main]

use durable_shared::EventId;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        match text.parse::<EventId>() {
            Ok(id) => {
                assert_eq!(id.to_string(), text, "a non-canonical id was accepted");
                assert!(
                    (1..=i64::MAX as u64).contains(&id.seq),
                    "seq {} cannot be stored",
                    id.seq
                );
            }
            Err(e) => {
                let message = e.to_string();
                assert!(message.contains("Last-Event-ID"), "{message}");
            }
        }
    }
    // Any id the server can hand out: 128 bits of token, a seq in 1..=i64::MAX.
    if data.len() >= 24 {
        let token: String = data[..16].iter().map(|b| format!("{b:02x}")).collect();
        let seq = u64::from_le_bytes(data[16..24].try_into().unwrap()) % i64::MAX as u64 + 1;
        let id = EventId { token, seq };
        assert_eq!(id.to_string().parse::<EventId>(), Ok(id));
    }
});
