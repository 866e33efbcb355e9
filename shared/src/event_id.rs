//! The SSE event ids the server hands out: `{token}.{seq}`, parsed the same way by the server
//! (to check a `Last-Event-ID`) and by its clients (to order events).

use std::fmt;
use std::str::FromStr;

/// An event id: `token` (32 lowercase hex digits, random per stream) and `seq` (1-based position
/// of the event in its stream, at most `i64::MAX`: both stores keep it as a signed 64-bit
/// integer). Only the canonical text is accepted (decimal digits without sign or leading zero),
/// so one event has one id and an id parses back to what [`fmt::Display`] writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventId {
    pub token: String,
    pub seq: u64,
}

/// Why a `Last-Event-ID` could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MalformedEventId(pub String);

impl fmt::Display for MalformedEventId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Last-Event-ID {:?} is not an event id of this server (expected <32 hex digits>.<number>)",
            self.0
        )
    }
}

impl std::error::Error for MalformedEventId {}

impl FromStr for EventId {
    type Err = MalformedEventId;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let malformed = || MalformedEventId(text.chars().take(100).collect());
        let (token, seq) = text.split_once('.').ok_or_else(malformed)?;
        let valid_token = token.len() == 32
            && token
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        // `u64::from_str` alone would also take `+7` and `007`.
        let canonical_seq =
            seq.bytes().all(|b| b.is_ascii_digit()) && !seq.starts_with('0') && !seq.is_empty();
        let seq: u64 = seq.parse().map_err(|_| malformed())?;
        if !valid_token || !canonical_seq || seq > i64::MAX as u64 {
            return Err(malformed());
        }
        Ok(EventId {
            token: token.to_owned(),
            seq,
        })
    }
}

impl fmt::Display for EventId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.token, self.seq)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_and_garbage_is_refused() {
        let id: EventId = "0123456789abcdef0123456789abcdef.42".parse().unwrap();
        assert_eq!(id.seq, 42);
        assert_eq!(id.to_string(), "0123456789abcdef0123456789abcdef.42");
        for bad in [
            "",
            "0",
            "42",
            "0/1",
            "0123456789abcdef0123456789abcdef",
            "0123456789abcdef0123456789abcdef.0",
            "0123456789abcdef0123456789abcdef.-1",
            "0123456789ABCDEF0123456789abcdef.1",
            "0123456789abcdef0123456789abcde.1",
            "zz23456789abcdef0123456789abcdef.1",
        ] {
            assert!(bad.parse::<EventId>().is_err(), "{bad:?} parsed");
        }
    }

    /// Regression (found by the `event_id` fuzz target): `u64::from_str` accepted `+42` and
    /// `042`, so one event had several ids, and a seq above `i64::MAX` parsed although no store
    /// can hold it (a `Last-Event-ID` with one got 500 instead of 400).
    #[test]
    fn only_canonical_storable_seqs_parse() {
        let token = "0123456789abcdef0123456789abcdef";
        for bad in [
            "+42",
            "042",
            "00",
            " 42",
            "42 ",
            "9223372036854775808",
            "18446744073709551615",
        ] {
            let text = format!("{token}.{bad}");
            assert_eq!(
                text.parse::<EventId>(),
                Err(MalformedEventId(text.clone())),
                "{text:?} parsed"
            );
        }
        let max = format!("{token}.9223372036854775807");
        let id: EventId = max.parse().unwrap();
        assert_eq!((id.seq, id.to_string()), (i64::MAX as u64, max));
    }
}
