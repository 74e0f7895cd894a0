//! The verifier batch format's output line (design.md §1): what `rlvrctl verify` prints, one per
//! input line, and what `POST /v1/verify` answers in `results`. The input side is read by
//! `rlvr_plugin_host::verify::parse_line`, which accepts the format's conveniences.
//!
//! Components keep their order both ways.

use serde::de::{MapAccess, Visitor};
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// One output line.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct OutputLine {
    /// The input's id, or null when it had none.
    pub id: Option<String>,
    /// The reward.
    pub score: f64,
    /// Whether the item counts as correct.
    pub passed: bool,
    /// Named parts of the score, in the verifier's order.
    #[cfg_attr(feature = "openapi", schema(value_type = std::collections::BTreeMap<String, f64>))]
    pub components: Components,
    /// The graded answer.
    pub extracted: Option<String>,
    /// Why the item could not be judged.
    pub error: Option<String>,
    /// Whether its time ran out (then `error` says so).
    #[serde(default)]
    pub timed_out: bool,
    /// Time in the verifier, microseconds.
    pub latency_us: u64,
    /// `name@version` of the verifier that judged it (`reward` for a formula's line).
    #[serde(default)]
    pub verifier: String,
    /// With `--explain`: what was extracted and why it matched or not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub explanation: Option<Vec<String>>,
}

/// Components, a JSON object in the verifier's order (kept on reading too).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Components(pub Vec<(String, f64)>);

impl Serialize for Components {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.0.len()))?;
        for (name, value) in &self.0 {
            map.serialize_entry(name, value)?;
        }
        map.end()
    }
}

impl<'de> Deserialize<'de> for Components {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct InOrder;
        impl<'de> Visitor<'de> for InOrder {
            type Value = Components;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("an object of numbers")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Components, A::Error> {
                let mut entries = Vec::new();
                while let Some(entry) = map.next_entry::<String, f64>()? {
                    entries.push(entry);
                }
                Ok(Components(entries))
            }
        }
        deserializer.deserialize_map(InOrder)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_round_trips_with_its_components_in_order() {
        let line = OutputLine {
            id: Some("a".into()),
            score: 0.5,
            passed: false,
            components: Components(vec![("z".into(), 1.0), ("a".into(), 0.0)]),
            extracted: None,
            error: Some("late".into()),
            timed_out: true,
            latency_us: 9,
            verifier: "math@0.1.0".into(),
            explanation: None,
        };
        let text = serde_json::to_string(&line).unwrap();
        assert!(text.contains(r#""components":{"z":1.0,"a":0.0}"#), "{text}");
        assert_eq!(serde_json::from_str::<OutputLine>(&text).unwrap(), line);
    }
}
