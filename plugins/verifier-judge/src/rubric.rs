//! The rubric: what the judge is asked to answer (a score in a range, or one of some labels),
//! how its answer becomes a verdict, and the words and JSON schema that tell the judge so.

use serde_json::{Value, json};

/// A checked rubric.
#[derive(Debug, Clone, PartialEq)]
pub enum Rubric {
    /// `{"score": s}` with `min ≤ s ≤ max`; the verdict's score is `(s − min) / (max − min)`,
    /// passed when `s ≥ pass_threshold`.
    Score {
        /// The lowest score.
        min: f64,
        /// The highest score, above `min`.
        max: f64,
        /// The lowest passing score, in `[min, max]`.
        pass_threshold: f64,
    },
    /// `{"label": l}` with `l` one of `labels`; score 1 and passed when `l` is in
    /// `passing_labels`, else score 0.
    Label {
        /// Every label the judge may answer, distinct, none empty.
        labels: Vec<String>,
        /// The labels that pass, a non-empty subset of `labels`.
        passing_labels: Vec<String>,
    },
}

/// The judge's choice, checked against the rubric.
#[derive(Debug, Clone, PartialEq)]
pub enum Choice {
    /// A score in `[min, max]`.
    Score(f64),
    /// One of the labels.
    Label(String),
}

impl Rubric {
    /// The key the judge answers with: `score` or `label`.
    pub fn key(&self) -> &'static str {
        match self {
            Rubric::Score { .. } => "score",
            Rubric::Label { .. } => "label",
        }
    }

    /// One line for explanations: `score 0 to 10, passes at 7 or more` or `label, one of
    /// "correct", "incorrect"; passing: "correct"`.
    pub fn summary(&self) -> String {
        match self {
            Rubric::Score { min, max, pass_threshold } => {
                format!(
                    "score {min} to {max}, normalised (s − {min}) / ({max} − {min}), passes at {pass_threshold} or more"
                )
            }
            Rubric::Label { labels, passing_labels } => {
                format!("label, one of {}; passing: {}", quoted(labels), quoted(passing_labels))
            }
        }
    }

    /// The verdict's score and whether it passed.
    pub fn grade(&self, choice: &Choice) -> (f64, bool) {
        match (self, choice) {
            (Rubric::Score { min, max, pass_threshold }, Choice::Score(score)) => {
                ((score - min) / (max - min), score >= pass_threshold)
            }
            (Rubric::Label { passing_labels, .. }, Choice::Label(label)) => {
                let passed = passing_labels.contains(label);
                (if passed { 1.0 } else { 0.0 }, passed)
            }
            // A choice is only ever made by parsing against this same rubric.
            _ => (0.0, false),
        }
    }

    /// The sentence appended to the prompt (`answer_instruction`): the exact form the parser
    /// accepts, so a judge that follows it is never refused.
    pub fn instruction(&self) -> String {
        let choice = match self {
            Rubric::Score { min, max, .. } => format!("\"score\": <a number from {min} to {max}>"),
            Rubric::Label { labels, .. } => format!("\"label\": <one of {}>", quoted(labels)),
        };
        format!(
            "Answer with exactly one JSON object and nothing else: {{\"reason\": \"<one or two sentences>\", {choice}}}"
        )
    }

    /// The JSON schema of the answer, for `response_format` `json_schema`. Servers that honour it
    /// constrain decoding to it; the parser does not rely on it.
    pub fn schema(&self) -> Value {
        let choice = match self {
            Rubric::Score { min, max, .. } => json!({"type": "number", "minimum": min, "maximum": max}),
            Rubric::Label { labels, .. } => json!({"type": "string", "enum": labels}),
        };
        // `reason` first: a model that writes its reason before its choice judges better, and
        // strict schemas decode properties in order.
        let mut properties = serde_json::Map::new();
        properties.insert("reason".into(), json!({"type": "string"}));
        properties.insert(self.key().into(), choice);
        json!({
            "type": "object",
            "properties": properties,
            "required": ["reason", self.key()],
            "additionalProperties": false,
        })
    }
}

/// `"a", "b"`.
fn quoted(labels: &[String]) -> String {
    labels.iter().map(|label| format!("{label:?}")).collect::<Vec<_>>().join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn score() -> Rubric {
        Rubric::Score { min: 0.0, max: 10.0, pass_threshold: 7.0 }
    }

    fn label() -> Rubric {
        Rubric::Label {
            labels: vec!["correct".into(), "incorrect".into(), "unsure".into()],
            passing_labels: vec!["correct".into()],
        }
    }

    #[test]
    fn grades() {
        let cases: &[(Rubric, Choice, (f64, bool))] = &[
            (score(), Choice::Score(7.0), (0.7, true)),
            (score(), Choice::Score(6.5), (0.65, false)),
            (score(), Choice::Score(0.0), (0.0, false)),
            (score(), Choice::Score(10.0), (1.0, true)),
            (Rubric::Score { min: 1.0, max: 5.0, pass_threshold: 4.0 }, Choice::Score(3.0), (0.5, false)),
            (Rubric::Score { min: -1.0, max: 1.0, pass_threshold: 0.0 }, Choice::Score(0.0), (0.5, true)),
            (label(), Choice::Label("correct".into()), (1.0, true)),
            (label(), Choice::Label("incorrect".into()), (0.0, false)),
            (label(), Choice::Label("unsure".into()), (0.0, false)),
        ];
        for (rubric, choice, expected) in cases {
            assert_eq!(rubric.grade(choice), *expected, "{rubric:?} {choice:?}");
        }
    }

    #[test]
    fn words_and_schema() {
        assert_eq!(
            score().instruction(),
            "Answer with exactly one JSON object and nothing else: {\"reason\": \"<one or two sentences>\", \
             \"score\": <a number from 0 to 10>}"
        );
        assert_eq!(
            label().instruction(),
            "Answer with exactly one JSON object and nothing else: {\"reason\": \"<one or two sentences>\", \
             \"label\": <one of \"correct\", \"incorrect\", \"unsure\">}"
        );
        assert_eq!(score().summary(), "score 0 to 10, normalised (s − 0) / (10 − 0), passes at 7 or more");
        assert_eq!(
            label().summary(),
            "label, one of \"correct\", \"incorrect\", \"unsure\"; passing: \"correct\""
        );
        assert_eq!(
            label().schema(),
            json!({"type": "object",
                   "properties": {"reason": {"type": "string"},
                                  "label": {"type": "string", "enum": ["correct", "incorrect", "unsure"]}},
                   "required": ["reason", "label"], "additionalProperties": false})
        );
        assert_eq!(
            score().schema()["properties"]["score"],
            json!({"type": "number", "minimum": 0.0, "maximum": 10.0})
        );
    }
}
