//! What a team reads of the server: never its paths. A job's record keeps the paths its worker
//! and the daemon work with (the candidate's checkpoint, the published version's directory, the
//! baseline the gates scored, a reason quoting a worker's error); what a team token reads of it
//! has each known server path replaced by the name the team knows it by (**pure**, built once
//! from the config): a base model's path by `base:NAME`, a data root's by `root:NAME`, the
//! registry by `registry:`, the rest of the state directory by `state:`. Admins read the paths.

use std::borrow::Cow;
use std::path::Path;

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

/// The server's paths and the names shown in their place.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ShownPaths {
    /// `(path, name)`, the longest path first, so that a path inside another (the registry
    /// inside the state directory) is named by the nearer one.
    replacements: Vec<(String, String)>,
}

impl ShownPaths {
    /// From `(path, name)` pairs; a path is also known by its canonical form (what the worker
    /// prints when it resolved links).
    pub fn new<'a>(pairs: impl IntoIterator<Item = (&'a Path, String)>) -> Self {
        let mut replacements = Vec::new();
        for (path, name) in pairs {
            let forms = [Some(path.to_path_buf()), path.canonicalize().ok()];
            for form in forms.into_iter().flatten() {
                let text = form.to_string_lossy().trim_end_matches('/').to_owned();
                // The root, or a relative path, would replace far more than a path.
                if text.len() > 1 && text.starts_with('/') {
                    replacements.push((text, name.clone()));
                }
            }
        }
        replacements.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then_with(|| a.0.cmp(&b.0)));
        replacements.dedup_by(|a, b| a.0 == b.0);
        ShownPaths { replacements }
    }

    /// `text` with each server path replaced by its name (`/srv/models/m1/config.json` →
    /// `base:m1/config.json`).
    pub fn text<'t>(&self, text: &'t str) -> Cow<'t, str> {
        if !self.replacements.iter().any(|(path, _)| text.contains(path.as_str())) {
            return Cow::Borrowed(text);
        }
        let mut shown = text.to_owned();
        for (path, name) in &self.replacements {
            if shown.contains(path.as_str()) {
                shown = shown.replace(path.as_str(), name);
            }
        }
        Cow::Owned(shown)
    }

    /// Every string in `value`, in place.
    pub fn value(&self, value: &mut Value) {
        match value {
            Value::String(text) => {
                if let Cow::Owned(shown) = self.text(text) {
                    *text = shown;
                }
            }
            Value::Array(items) => items.iter_mut().for_each(|item| self.value(item)),
            Value::Object(fields) => fields.values_mut().for_each(|field| self.value(field)),
            _ => {}
        }
    }

    /// A record as a team reads it: through JSON, every string shown. A value that does not
    /// come back as its type (it cannot: only strings change) is returned as it was.
    pub fn record<T: Serialize + DeserializeOwned>(&self, record: T) -> T {
        if self.replacements.is_empty() {
            return record;
        }
        let Ok(mut value) = serde_json::to_value(&record) else { return record };
        self.value(&mut value);
        serde_json::from_value(value).unwrap_or(record)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn shown() -> ShownPaths {
        ShownPaths::new([
            (Path::new("/var/lib/rlvr"), "state:".to_owned()),
            (Path::new("/var/lib/rlvr/registry/"), "registry:".to_owned()),
            (Path::new("/srv/models/smollm2"), "base:smollm2".to_owned()),
            (Path::new("/"), "nothing".to_owned()),
            (Path::new("relative"), "nothing".to_owned()),
        ])
    }

    #[test]
    fn each_path_is_named_by_the_nearest_name_and_other_text_stays() {
        let rows = [
            ("/var/lib/rlvr/registry/tiny/3", "registry:/tiny/3"),
            (
                "/var/lib/rlvr/jobs/01J/run/checkpoints/step-00000010",
                "state:/jobs/01J/run/checkpoints/step-00000010",
            ),
            (
                "data.train: cannot read /var/lib/rlvr/datasets/blobs/ab.jsonl: No such file",
                "data.train: cannot read state:/datasets/blobs/ab.jsonl: No such file",
            ),
            (
                "/srv/models/smollm2/config.json and /srv/models/smollm2",
                "base:smollm2/config.json and base:smollm2",
            ),
            ("/srv/models/other", "/srv/models/other"),
            ("a relative path and / alone", "a relative path and / alone"),
        ];
        let shown = shown();
        for (text, want) in rows {
            assert_eq!(shown.text(text), want, "{text}");
        }
        assert!(matches!(shown.text("nothing to hide"), Cow::Borrowed(_)));
    }

    #[test]
    fn every_string_of_a_record_is_shown_and_its_other_values_are_kept() {
        let record = json!({
            "reason": "worker exited: /var/lib/rlvr/jobs/x",
            "result": {"checkpoint": "/var/lib/rlvr/jobs/x/run/checkpoints/step-1", "steps": 3},
            "gates": {"baseline": {"model": "/srv/models/smollm2", "version": null}},
            "list": ["/var/lib/rlvr/registry/l/1", 2.5, true],
        });
        let got = shown().record(record);
        assert_eq!(
            got,
            json!({
                "reason": "worker exited: state:/jobs/x",
                "result": {"checkpoint": "state:/jobs/x/run/checkpoints/step-1", "steps": 3},
                "gates": {"baseline": {"model": "base:smollm2", "version": null}},
                "list": ["registry:/l/1", 2.5, true],
            })
        );
    }
}
