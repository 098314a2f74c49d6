//! Wall-clock helpers shared by the records, the event log and the targets (a leaf module: it
//! depends on nothing else of the crate).

use std::time::{SystemTime, UNIX_EPOCH};

/// Serde for a `Duration` as a human string (`"90s"`, `"2m 30s"`), as profiles write them.
pub mod human {
    use serde::{Deserialize, Deserializer, Serializer};
    use std::time::Duration;
    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(&humantime::format_duration(*d))
    }
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let s = String::deserialize(d)?;
        humantime::parse_duration(&s).map_err(serde::de::Error::custom)
    }
}

/// Now as RFC 3339 UTC (seconds): what records, run ConfigMaps and JSON logs carry.
pub fn now_rfc3339() -> String {
    humantime::format_rfc3339_seconds(SystemTime::now()).to_string()
}

/// Now in milliseconds since the Unix epoch (0 for a clock before it).
pub fn unix_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}
