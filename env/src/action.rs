//! How a model's turn becomes an environment's action (**pure**): the turn's text (its end-of-turn
//! token left out) read one of three ways —
//!
//! - [`ActionFormat::Field`]: the whole turn, trimmed, as one named field (`{"answer": "42"}`):
//!   for environments whose action is a single string;
//! - [`ActionFormat::Json`]: the first JSON object in the turn, as written (text around it is the
//!   model's own and ignored);
//! - [`ActionFormat::Hermes`]: one tool call in the Hermes format the Qwen2.5/Qwen3, Hermes and
//!   SmolLM3 chat templates use, `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`; the
//!   action is the call's `arguments`, and its `name` must be the one the job names when it names
//!   one.
//!
//! What the action must hold beyond its shape is the environment's to say: it validates an action
//! against its own schema and answers a malformed one with its reason, which the episode records.
//! A turn that cannot be read is an [`ActionError`] whose text is the model's fault, said in words.

use serde_json::{Map, Value};

/// How actions are read from the model's turns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ActionFormat {
    /// The turn's text as this one field.
    Field(String),
    /// The first JSON object in the turn.
    Json,
    /// One Hermes tool call; `Some(name)`: the only tool the job offers.
    Hermes(Option<String>),
}

/// Why a turn is not an action.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ActionError {
    #[error("the turn holds no JSON object")]
    NoJson,
    #[error("the turn's JSON does not read: {0}")]
    BadJson(String),
    #[error("the turn holds no <tool_call>…</tool_call>")]
    NoToolCall,
    #[error("the turn holds {0} tool calls; one a turn is read")]
    ToolCalls(usize),
    #[error("the tool call is not {{\"name\": …, \"arguments\": {{…}}}}: {0}")]
    BadToolCall(String),
    #[error("the tool call names {got:?}; the tool is {expected:?}")]
    WrongTool { got: String, expected: String },
}

const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";

/// The action in `turn` (the model's text, its end-of-turn token left out) read as `format`.
pub fn read_action(format: &ActionFormat, turn: &str) -> Result<Value, ActionError> {
    match format {
        ActionFormat::Field(name) => {
            let mut action = Map::new();
            action.insert(name.clone(), Value::String(turn.trim().to_owned()));
            Ok(Value::Object(action))
        }
        ActionFormat::Json => first_object(turn),
        ActionFormat::Hermes(tool) => tool_call(turn, tool.as_deref()),
    }
}

/// The first JSON object in `text`: from each `{` in turn, the longest JSON value that parses there.
fn first_object(text: &str) -> Result<Value, ActionError> {
    let mut first_error = None;
    for (at, _) in text.match_indices('{') {
        let mut values = serde_json::Deserializer::from_str(&text[at..]).into_iter::<Value>();
        match values.next() {
            Some(Ok(value @ Value::Object(_))) => return Ok(value),
            Some(Ok(_)) => {}
            Some(Err(error)) => {
                first_error.get_or_insert_with(|| error.to_string());
            }
            None => {}
        }
    }
    Err(first_error.map_or(ActionError::NoJson, ActionError::BadJson))
}

/// The `arguments` of the one Hermes tool call in `text`.
fn tool_call(text: &str, tool: Option<&str>) -> Result<Value, ActionError> {
    let calls: Vec<&str> =
        text.split(OPEN).skip(1).map(|rest| rest.split_once(CLOSE).map_or(rest, |(call, _)| call)).collect();
    let call = match calls.as_slice() {
        [] => return Err(ActionError::NoToolCall),
        [call] => call.trim(),
        more => return Err(ActionError::ToolCalls(more.len())),
    };
    let value: Value =
        serde_json::from_str(call).map_err(|error| ActionError::BadToolCall(error.to_string()))?;
    let Value::Object(mut call) = value else {
        return Err(ActionError::BadToolCall("not an object".into()));
    };
    let name = match call.remove("name") {
        Some(Value::String(name)) => name,
        _ => return Err(ActionError::BadToolCall("no \"name\" string".into())),
    };
    if let Some(expected) = tool
        && name != expected
    {
        return Err(ActionError::WrongTool { got: name, expected: expected.to_owned() });
    }
    match call.remove("arguments") {
        Some(arguments @ Value::Object(_)) => Ok(arguments),
        // Some models write the arguments as a JSON string, as the OpenAI API carries them.
        Some(Value::String(text)) => match serde_json::from_str::<Value>(&text) {
            Ok(arguments @ Value::Object(_)) => Ok(arguments),
            _ => Err(ActionError::BadToolCall("\"arguments\" is a string that is not a JSON object".into())),
        },
        None => Ok(Value::Object(Map::new())),
        Some(_) => Err(ActionError::BadToolCall("\"arguments\" is not an object".into())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn turns_read_as_actions_or_say_why_not() {
        let field = ActionFormat::Field("answer".into());
        let hermes = ActionFormat::Hermes(None);
        let guess = ActionFormat::Hermes(Some("guess".into()));
        let call = |body: &str| format!("Let me call it.\n<tool_call>\n{body}\n</tool_call>");
        // (format, the turn, the action or the error)
        let cases: Vec<(&ActionFormat, String, Result<Value, ActionError>)> = vec![
            (&field, " 42 \n".into(), Ok(json!({"answer": "42"}))),
            (&field, String::new(), Ok(json!({"answer": ""}))),
            (
                &ActionFormat::Json,
                r#"I move {"row": 1, "col": 2} now"#.into(),
                Ok(json!({"row": 1, "col": 2})),
            ),
            // A brace that opens no object is passed over; the first object wins.
            (
                &ActionFormat::Json,
                r#"{x} then {"a": {"b": [1]}} {"c": 3}"#.into(),
                Ok(json!({"a": {"b": [1]}})),
            ),
            (&ActionFormat::Json, "no braces at all".into(), Err(ActionError::NoJson)),
            (
                &ActionFormat::Json,
                r#"{"a": 1"#.into(),
                Err(ActionError::BadJson("EOF while parsing an object at line 1 column 7".into())),
            ),
            (&hermes, call(r#"{"name": "guess", "arguments": {"n": 7}}"#), Ok(json!({"n": 7}))),
            (&hermes, call(r#"{"name": "guess", "arguments": "{\"n\": 7}"}"#), Ok(json!({"n": 7}))),
            (&hermes, call(r#"{"name": "look"}"#), Ok(json!({}))),
            (&guess, call(r#"{"name": "guess", "arguments": {"n": 7}}"#), Ok(json!({"n": 7}))),
            (
                &guess,
                call(r#"{"name": "peek", "arguments": {}}"#),
                Err(ActionError::WrongTool { got: "peek".into(), expected: "guess".into() }),
            ),
            (&hermes, "the answer is 7".into(), Err(ActionError::NoToolCall)),
            (
                &hermes,
                format!("{}{}", call(r#"{"name": "a"}"#), call(r#"{"name": "b"}"#)),
                Err(ActionError::ToolCalls(2)),
            ),
            (
                &hermes,
                call(r#"{"arguments": {}}"#),
                Err(ActionError::BadToolCall("no \"name\" string".into())),
            ),
            (
                &hermes,
                call(r#"{"name": "a", "arguments": [1]}"#),
                Err(ActionError::BadToolCall("\"arguments\" is not an object".into())),
            ),
            // Cut off before its closing tag: what is there is read.
            (
                &hermes,
                "<tool_call>{\"name\": \"guess\", \"arguments\": {\"n\": 1}}".into(),
                Ok(json!({"n": 1})),
            ),
        ];
        for (format, turn, expected) in cases {
            assert_eq!(read_action(format, &turn), expected, "{format:?} on {turn:?}");
        }
    }
}
