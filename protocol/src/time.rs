//! Timestamps on the wire: RFC 3339 in UTC with milliseconds.

/// Serde adapter for `SystemTime` as RFC 3339 text.
pub mod rfc3339 {
    use std::time::SystemTime;

    use serde::Serializer;

    /// `2026-11-21T06:03:00.123Z`.
    pub fn format(time: SystemTime) -> String {
        humantime::format_rfc3339_millis(time).to_string()
    }

    /// Serializes as `2026-11-21T06:03:00.123Z`.
    pub fn serialize<S: Serializer>(time: &SystemTime, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(&humantime::format_rfc3339_millis(*time))
    }
}

/// The UTC date of `time`, `2026-11-21`: the day a once-a-day job counts for.
pub fn utc_date(time: std::time::SystemTime) -> String {
    let text = humantime::format_rfc3339_seconds(time).to_string();
    text[..10].to_owned()
}
