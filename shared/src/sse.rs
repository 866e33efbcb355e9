//! Server-sent events as this server writes them, parsed the same way by every client of the
//! project (the dashboard and the test suites).

use crate::EventId;

/// One SSE event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SseEvent {
    pub id: Option<String>,
    /// The `data:` lines joined by newlines; empty for a priming event.
    pub data: String,
    /// The reconnect delay the server suggests (`retry:`), in milliseconds.
    pub retry_ms: Option<u64>,
}

impl SseEvent {
    /// Parses one event (the text up to and including its blank line). Comments (keep-alives)
    /// and blank text give `None`.
    pub fn parse(raw: &str) -> Option<SseEvent> {
        let mut event = SseEvent {
            id: None,
            data: String::new(),
            retry_ms: None,
        };
        let (mut fields, mut data_lines) = (0, 0);
        for line in raw.lines().filter(|l| !l.is_empty() && !l.starts_with(':')) {
            fields += 1;
            let (name, value) = line.split_once(':').unwrap_or((line, ""));
            let value = value.strip_prefix(' ').unwrap_or(value);
            match name {
                "id" => event.id = Some(value.to_owned()),
                "data" => {
                    // Several data lines are one value joined by newlines (the SSE rules).
                    if data_lines > 0 {
                        event.data.push('\n');
                    }
                    data_lines += 1;
                    event.data.push_str(value);
                }
                "retry" => event.retry_ms = value.parse().ok(),
                _ => {}
            }
        }
        (fields > 0).then_some(event)
    }

    /// A priming event: an id (and maybe `retry:`) with empty data.
    pub fn is_priming(&self) -> bool {
        self.data.is_empty()
    }

    /// This event's id, if it is one of the server's.
    pub fn event_id(&self) -> Option<EventId> {
        self.id.as_deref()?.parse().ok()
    }
}

/// Splits a buffer of SSE text at the end of its first complete event, if there is one.
pub fn take_event(buffer: &mut Vec<u8>) -> Option<Vec<u8>> {
    let end = buffer.windows(2).position(|w| w == b"\n\n")?;
    Some(buffer.drain(..end + 2).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_comments_and_priming_parse() {
        let event = SseEvent::parse("id: abc.3\nretry: 3000\ndata: \n\n").unwrap();
        assert!(event.is_priming());
        assert_eq!(event.retry_ms, Some(3000));
        assert_eq!(event.id.as_deref(), Some("abc.3"));
        let event = SseEvent::parse("id: 0123456789abcdef0123456789abcdef.3\ndata: \n\n").unwrap();
        let id = event.event_id().unwrap();
        assert_eq!(
            (id.token.as_str(), id.seq),
            ("0123456789abcdef0123456789abcdef", 3)
        );
        let event = SseEvent::parse("data: {\"a\":1}\nid:x.1\n\n").unwrap();
        assert_eq!(event.data, "{\"a\":1}");
        assert_eq!(SseEvent::parse(":keep-alive\n\n"), None);
        let event = SseEvent::parse("data: {\"a\":\ndata: 1}\n\n").unwrap();
        assert_eq!(event.data, "{\"a\":\n1}");
        let mut buffer = b"data: 1\n\ndata: 2".to_vec();
        assert_eq!(take_event(&mut buffer).unwrap(), b"data: 1\n\n");
        assert_eq!(take_event(&mut buffer), None);
    }
}
