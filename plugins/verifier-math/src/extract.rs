//! Finding the final answer in a completion: only what the model commits to is graded.
//!
//! Order: the text after the last `</think>` (nothing when a `<think>` never closes; a verbatim
//! echo of the prompt removed; chat-template tokens end it) → the last `\boxed{…}`/`\fbox{…}`,
//! together with the boxes just before it that only short connective text separates
//! (`\boxed{1} and \boxed{2}` is the answer list `1; 2`, so hedging never matches a single gold)
//! → the text after the last `final answer is` / `answer:` marker, up to the end of its sentence
//! (its first answer, with any alternatives offered after it as a list)
//! → the configured [`Fallback`].

use crate::lexer::repair_escapes;

/// What to grade when a completion has neither a box nor an answer marker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Fallback {
    /// Nothing: the completion has no answer (the default, for training: a model learns to
    /// state its answer, and no stray number in its reasoning is graded).
    #[default]
    None,
    /// The whole text when it is a bare answer (no prose words), else the last math span
    /// (`$…$`, `\(…\)`, `\[…\]`) or plain number (`1,000.99`, `2/3`), whichever ends later (for
    /// evaluation of models that were not trained to box their answers).
    Last,
}

/// Where the answer came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// The last box, with `count − 1` boxes right before it.
    Boxed {
        /// Boxes in the final group.
        count: usize,
    },
    /// After an answer marker.
    Marker(&'static str),
    /// The fallback.
    Fallback,
    /// The whole text (gold answers without a box).
    Whole,
}

/// An extracted answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Extraction {
    /// The answer text, boxes of a group joined by `; `.
    pub answer: String,
    /// Where it was found.
    pub source: Source,
}

/// Why no answer was found.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotFound {
    /// `<think>` without `</think>`.
    #[error("the reasoning block never closes: nothing after </think> to grade")]
    UnclosedThink,
    /// The last box never closes or is empty.
    #[error("the last \\boxed{{}} is empty or never closes")]
    BadBox,
    /// No box, no marker, and fallback is off or found nothing.
    #[error("no \\boxed{{}} answer and no answer marker (fallback: {0})")]
    Nothing(&'static str),
}

/// Longest text between two boxes of one answer group.
const MAX_GAP: usize = 50;
/// GSM8K's answer marker (Cobbe et al. 2021): `#### 72` ends a solution.
const GSM8K: &str = "####";
const MARKERS: &[&str] =
    &["final answer is", "final answer:", "the answer is", "answer is", "answer:", "final answer", GSM8K];
const CHAT_TOKENS: &[&str] = &["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end|>"];

/// Extracts the answer of a completion.
pub fn extract(completion: &str, prompt: &str, fallback: Fallback) -> Result<Extraction, NotFound> {
    let mut text = completion.to_owned();
    let prompt = prompt.trim();
    if prompt.len() >= 8 && text.contains(prompt) {
        text = text.replace(prompt, " ");
    }
    let Some(at) = text.rfind("</think>") else {
        if text.contains("<think>") {
            return Err(NotFound::UnclosedThink);
        }
        return answer_in(text, fallback);
    };
    let region = &text[at + "</think>".len()..];
    if region.contains("<think>") {
        // A reasoning block reopened after the last `</think>` never closes either.
        return Err(NotFound::UnclosedThink);
    }
    match answer_in(region.to_owned(), fallback) {
        // A stray `</think>` after the answer (`<think>…</think>\boxed{4}</think>`): when nothing
        // after it answers, the text between the last two `</think>` is graded — only when no
        // `<think>` opens in it, i.e. it lies outside every reasoning block.
        Err(NotFound::Nothing(why)) => match text[..at].rfind("</think>") {
            Some(before) if !text[before..at].contains("<think>") => {
                answer_in(text[before + "</think>".len()..at].to_owned(), fallback)
                    .map_err(|_| NotFound::Nothing(why))
            }
            _ => Err(NotFound::Nothing(why)),
        },
        other => other,
    }
}

/// The answer in the text after the reasoning.
fn answer_in(mut region: String, fallback: Fallback) -> Result<Extraction, NotFound> {
    if let Some(cut) = CHAT_TOKENS.iter().filter_map(|t| region.find(t)).min() {
        region.truncate(cut);
    }
    let region = repair_escapes(&region);
    let marked = after_marker(&region);
    match boxed_group(&region) {
        BoxSearch::Found(parts, box_end) => {
            // Boxes and answer markers compete by position: the last stated answer wins, so a
            // Minerva-style "Final Answer: The final answer is $10,455$" after a `\boxed{255}`
            // in the working is the answer. Only a marker that a value follows at once counts
            // here ("the answer is correct because 3·4 = 12" after a box states nothing new).
            if let Some((marker, start, after)) = &marked {
                if *start >= box_end {
                    if let Some(answer) = marker_answer(marker, after, true) {
                        return Ok(Extraction { answer, source: Source::Marker(marker) });
                    }
                }
            }
            let count = parts.len();
            return Ok(Extraction { answer: parts.join("; "), source: Source::Boxed { count } });
        }
        BoxSearch::Bad => return Err(NotFound::BadBox),
        BoxSearch::None => {}
    }
    if let Some((marker, _, after)) = &marked {
        if let Some(answer) = marker_answer(marker, after, false) {
            return Ok(Extraction { answer, source: Source::Marker(marker) });
        }
    }
    match fallback {
        Fallback::None => Err(NotFound::Nothing("none")),
        Fallback::Last => bare_or_last(&region)
            .map(|answer| Extraction { answer, source: Source::Fallback })
            .ok_or(NotFound::Nothing("last")),
    }
}

/// The gold answer of a reference: its boxed group when it has one, else the whole text.
pub fn extract_gold(gold: &str) -> Extraction {
    let repaired = repair_escapes(gold);
    match boxed_group(&repaired) {
        BoxSearch::Found(parts, _) => {
            let count = parts.len();
            Extraction { answer: parts.join("; "), source: Source::Boxed { count } }
        }
        // A reference is trusted: a box that never closes runs to the end of the text.
        BoxSearch::Bad => match ["\\boxed{", "\\fbox{"]
            .iter()
            .filter_map(|b| repaired.rfind(b).map(|at| at + b.len()))
            .max()
        {
            Some(start) if !repaired[start..].trim().is_empty() => {
                Extraction { answer: repaired[start..].trim().to_owned(), source: Source::Boxed { count: 1 } }
            }
            _ => Extraction { answer: repaired.trim().to_owned(), source: Source::Whole },
        },
        // A GSM8K solution as the gold: its answer is the bare value after `####`.
        BoxSearch::None => match after_marker(&repaired) {
            Some((marker @ GSM8K, _, after)) => match marker_answer(marker, &after, true) {
                Some(answer) => Extraction { answer, source: Source::Marker(marker) },
                None => Extraction { answer: repaired.trim().to_owned(), source: Source::Whole },
            },
            _ => Extraction { answer: repaired.trim().to_owned(), source: Source::Whole },
        },
    }
}

enum BoxSearch {
    /// The group's answers and the end of its last box.
    Found(Vec<String>, usize),
    Bad,
    None,
}

/// Boxes of `text` as (start, end, content) with `None` content for one that never closes.
fn boxes(text: &str) -> Vec<(usize, usize, Option<String>)> {
    let bytes = text.as_bytes();
    let mut found = Vec::new();
    let mut from = 0;
    while let Some(offset) = ["\\boxed", "\\fbox"]
        .iter()
        .filter_map(|name| text[from..].find(name).map(|at| (at, name.len())))
        .min()
    {
        let (at, len) = offset;
        let start = from + at;
        let mut i = start + len;
        while i < bytes.len() && bytes[i] == b' ' {
            i += 1;
        }
        if i < bytes.len() && bytes[i] == b'{' {
            let mut depth = 0usize;
            let mut j = i;
            let mut end = None;
            while j < bytes.len() {
                match bytes[j] {
                    b'\\' => j += 1,
                    b'{' => depth += 1,
                    b'}' => {
                        depth -= 1;
                        if depth == 0 {
                            end = Some(j);
                            break;
                        }
                    }
                    _ => {}
                }
                j += 1;
            }
            match end {
                Some(end) => {
                    found.push((start, end + 1, Some(text[i + 1..end].to_owned())));
                    from = end + 1;
                }
                None => {
                    found.push((start, bytes.len(), None));
                    break;
                }
            }
        } else if i < bytes.len() && bytes[i].is_ascii_alphanumeric() && i > start + len {
            // `\boxed 5`
            let end = text[i..]
                .find(|c: char| c.is_whitespace() || c == '$' || c == '.' || c == ',')
                .map_or(text.len(), |e| i + e);
            found.push((start, end, Some(text[i..end].to_owned())));
            from = end;
        } else {
            from = start + len;
        }
    }
    found
}

fn boxed_group(text: &str) -> BoxSearch {
    let found = boxes(text);
    let Some(last) = found.last() else { return BoxSearch::None };
    match &last.2 {
        Some(content) if !content.trim().is_empty() => {}
        _ => return BoxSearch::Bad,
    }
    let end = last.1;
    let mut group = vec![last.2.clone().unwrap_or_default()];
    for pair in found.windows(2).rev() {
        let (before, after) = (&pair[0], &pair[1]);
        let gap = &text[before.1..after.0];
        let Some(content) = &before.2 else { break };
        if gap.chars().count() > MAX_GAP || gap.contains("\n\n") || content.trim().is_empty() {
            break;
        }
        group.push(content.clone());
    }
    group.reverse();
    BoxSearch::Found(group.into_iter().map(|s| s.trim().to_owned()).collect(), end)
}

/// The last answer marker of `text`: which, where it starts, and its sentence after it.
fn after_marker(text: &str) -> Option<(&'static str, usize, String)> {
    let lower = text.to_ascii_lowercase();
    let (marker, at) = MARKERS
        .iter()
        .filter_map(|m| lower.rfind(m).map(|at| (*m, at)))
        .max_by_key(|(m, at)| (*at + m.len(), m.len()))?;
    let mut after = text[at + marker.len()..].trim_start_matches([':', ' ', '*', '\n', '\t']).to_owned();
    // GSM8K's answer is the rest of the `####` line.
    let paragraph = if marker == GSM8K { "\n" } else { "\n\n" };
    if let Some(cut) = after.find(paragraph) {
        after.truncate(cut);
    }
    if let Some(cut) = sentence_end(&after) {
        after.truncate(cut);
    }
    let after = after.trim().trim_end_matches(['.', '*']).trim().to_owned();
    (!after.is_empty()).then_some((marker, at, after))
}

/// The answer a marker states. `####` (GSM8K) states a bare value or nothing, so a Markdown
/// heading `#### Step 2: …` is no answer. `leading`: only a value right after the marker
/// counts (for a marker after a box).
fn marker_answer(marker: &str, after: &str, leading: bool) -> Option<String> {
    if marker == GSM8K {
        return (!has_prose(after)).then(|| after.trim().to_owned()).filter(|a| !a.is_empty());
    }
    bare_or_first(after, leading)
}

/// The end of the first sentence: a period followed by whitespace, outside `$…$`.
fn sentence_end(text: &str) -> Option<usize> {
    let bytes = text.as_bytes();
    let mut in_math = false;
    for i in 0..bytes.len() {
        match bytes[i] {
            b'$' => in_math = !in_math,
            b'.' if !in_math && (i + 1 == bytes.len() || bytes[i + 1].is_ascii_whitespace()) => {
                return Some(i);
            }
            _ => {}
        }
    }
    None
}

/// Words that are not prose: connectives, function names, units.
fn is_prose_word(word: &str) -> bool {
    const NOT_PROSE: &[&str] = &[
        "or", "and", "pi", "sqrt", "sin", "cos", "tan", "ln", "log", "exp", "inf", "pct", "cm", "mm", "km",
        "kg", "mph", "ft", "in", "m", "s", "min", "hr", "deg",
    ];
    word.len() >= 2 && !NOT_PROSE.contains(&word)
}

/// Whether `text` has prose words outside math spans and commands.
fn has_prose(text: &str) -> bool {
    let masked = mask_spans(text, &math_spans(text));
    let bytes = masked.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i].is_ascii_alphabetic() {
            let start = i;
            while i < bytes.len() && bytes[i].is_ascii_alphabetic() {
                i += 1;
            }
            let word = &masked[start..i];
            let command = start > 0 && bytes[start - 1] == b'\\';
            let after_digit = start > 0 && bytes[start - 1].is_ascii_digit();
            let glued = after_digit && (word.starts_with("or") || word.starts_with("and"));
            if !command && !glued && is_prose_word(word) {
                return true;
            }
        } else {
            i += 1;
        }
    }
    false
}

/// The answer after a marker: the text itself when it is a bare answer, else its first math span
/// or number (with `leading`, only one that opens the text) (`The answer is 5, not 4` is `5`) — skipping a value-less span that the sentence
/// describes (`The largest $n$ is 34` is `34`) — together with the values after it offered as
/// alternatives (`5 or maybe 4` is the list `5; 4`, which never matches a single gold).
fn bare_or_first(text: &str, leading: bool) -> Option<String> {
    let trimmed = text.trim();
    if trimmed.is_empty() {
        return None;
    }
    if !has_prose(trimmed) && trimmed.chars().count() <= 1000 {
        return Some(trimmed.trim_end_matches('.').to_owned());
    }
    let spans = math_spans(trimmed);
    let masked = mask_spans(trimmed, &spans);
    let mut candidates: Vec<(usize, usize, String)> = spans
        .iter()
        .filter(|s| !trimmed[s.2..s.3].trim().is_empty())
        .map(|s| (s.0, s.1, trimmed[s.2..s.3].trim().to_owned()))
        .chain(numbers(&masked))
        .collect();
    candidates.sort_by_key(|c| c.0);
    let subject = |c: &(usize, usize, String)| {
        let after = trimmed[c.1..].trim_start().to_ascii_lowercase();
        !c.2.chars().any(|ch| ch.is_ascii_digit())
            && ["is ", "are ", "equals", "=", "was "].iter().any(|verb| after.starts_with(verb))
    };
    let skip = usize::from(!leading && candidates.len() > 1 && subject(&candidates[0]));
    let mut chosen = candidates.into_iter().skip(skip);
    let first = chosen.next()?;
    if leading && first.0 != 0 {
        return None;
    }
    let mut end = first.1;
    let mut answers = vec![first.2];
    for (start, next_end, answer) in chosen {
        let gap = trimmed[end..start].to_ascii_lowercase();
        let alternative = gap
            .split(|c: char| !c.is_ascii_alphabetic())
            .any(|word| matches!(word, "or" | "either" | "alternatively"));
        if !alternative {
            break;
        }
        answers.push(answer);
        end = next_end;
    }
    Some(answers.join("; "))
}

/// The text itself when it is a bare answer, else its last math span or number.
fn bare_or_last(text: &str) -> Option<String> {
    let trimmed = text.trim();
    if trimmed.is_empty() {
        return None;
    }
    if !has_prose(trimmed) && trimmed.chars().count() <= 1000 {
        return Some(trimmed.trim_end_matches('.').to_owned());
    }
    last_span_or_number(trimmed)
}

/// Math spans as (start, end, content start, content end).
fn math_spans(text: &str) -> Vec<(usize, usize, usize, usize)> {
    let mut spans = Vec::new();
    let mut i = 0;
    let bytes = text.as_bytes();
    while i < bytes.len() {
        let rest = &bytes[i..];
        let opener = if rest.starts_with(b"$$") {
            Some(("$$", "$$"))
        } else if bytes[i] == b'$' {
            Some(("$", "$"))
        } else if rest.starts_with(b"\\(") {
            Some(("\\(", "\\)"))
        } else if rest.starts_with(b"\\[") {
            Some(("\\[", "\\]"))
        } else {
            None
        };
        match opener {
            Some((open, close)) => {
                let content = i + open.len();
                match text[content..].find(close) {
                    Some(len) => {
                        let end = content + len + close.len();
                        spans.push((i, end, content, content + len));
                        i = end;
                    }
                    None => i += open.len(),
                }
            }
            None => i += 1,
        }
    }
    spans
}

fn mask_spans(text: &str, spans: &[(usize, usize, usize, usize)]) -> String {
    let mut masked = text.as_bytes().to_vec();
    for (start, end, ..) in spans {
        for byte in &mut masked[*start..*end] {
            *byte = b' ';
        }
    }
    // Only ASCII bytes were replaced, on whole spans that start and end on ASCII delimiters.
    String::from_utf8(masked).unwrap_or_default()
}

fn last_span_or_number(text: &str) -> Option<String> {
    let spans = math_spans(text);
    let span = spans.iter().rev().find(|s| !text[s.2..s.3].trim().is_empty());
    let masked = mask_spans(text, &spans);
    let number = last_number(&masked);
    match (span, number) {
        (Some(s), Some((end, n))) if end > s.1 => Some(n),
        (Some(s), _) => Some(text[s.2..s.3].trim().to_owned()),
        (None, Some((_, n))) => Some(n),
        (None, None) => None,
    }
}

/// The last plain number in `text` (not glued to a word before it), as (end, normalized text).
fn last_number(text: &str) -> Option<(usize, String)> {
    numbers(text).pop().map(|(_, end, n)| (end, n))
}

/// The plain numbers in `text` (not glued to a word before them), as (start, end, normalized
/// text).
fn numbers(text: &str) -> Vec<(usize, usize, String)> {
    let bytes = text.as_bytes();
    let digit = |i: usize| bytes.get(i).is_some_and(u8::is_ascii_digit);
    let mut found = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if !digit(i)
            || (i > 0
                && (bytes[i - 1].is_ascii_alphanumeric()
                    || matches!(bytes[i - 1], b'.' | b'_' | b'^' | b'\\')))
        {
            i += 1;
            continue;
        }
        let negative = i > 0 && bytes[i - 1] == b'-' && (i < 2 || !bytes[i - 2].is_ascii_alphanumeric());
        let mut out = String::new();
        if negative {
            out.push('-');
        }
        let begin = if negative { i - 1 } else { i };
        let start = i;
        while digit(i) {
            i += 1;
        }
        out.push_str(&text[start..i]);
        if i - start <= 3 {
            while bytes.get(i) == Some(&b',') && digit(i + 1) && digit(i + 2) && digit(i + 3) && !digit(i + 4)
            {
                out.push_str(&text[i + 1..i + 4]);
                i += 4;
            }
        }
        if bytes.get(i) == Some(&b'.') && digit(i + 1) {
            out.push('.');
            i += 1;
            let from = i;
            while digit(i) {
                i += 1;
            }
            out.push_str(&text[from..i]);
        } else if bytes.get(i) == Some(&b',')
            && digit(i + 1)
            && digit(i + 2)
            && !digit(i + 3)
            && !out.contains(',')
        {
            // `2,74`: a decimal comma (exactly two digits after it; three would be thousands).
            out.push('.');
            out.push_str(&text[i + 1..i + 3]);
            i += 3;
        } else if bytes.get(i) == Some(&b'/') && digit(i + 1) {
            out.push('/');
            i += 1;
            let from = i;
            while digit(i) {
                i += 1;
            }
            out.push_str(&text[from..i]);
        }
        found.push((begin, i, out));
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(completion: &str, fallback: Fallback, expected: Result<&str, NotFound>) {
        let got = extract(completion, "", fallback).map(|e| e.answer);
        assert_eq!(got.as_deref().map_err(Clone::clone), expected, "{completion:?}");
    }

    #[test]
    fn extraction_table() {
        use Fallback::{Last, None as Off};
        let cases: &[(&str, Fallback, Result<&str, NotFound>)] = &[
            ("so \\boxed{42}.", Off, Ok("42")),
            ("\\boxed{1} then \\boxed{2}", Off, Ok("1; 2")),
            (
                "\\boxed{1}\n\nLong reasoning here that goes on and on for a while.\n\n\\boxed{2}",
                Off,
                Ok("2"),
            ),
            ("<think>\\boxed{7}</think> The answer is \\boxed{8}", Off, Ok("8")),
            ("<think>\\boxed{7}</think> no answer", Off, Err(NotFound::Nothing("none"))),
            ("<think>\\boxed{7} never closes", Off, Err(NotFound::UnclosedThink)),
            ("<think>a</think> <think>\\boxed{7} reopened", Off, Err(NotFound::UnclosedThink)),
            // A stray `</think>` after the answer: the text before it, outside every think block.
            ("<think>\\boxed{3}</think>\\boxed{4}</think>", Off, Ok("4")),
            ("<think>\\boxed{3}</think>\\boxed{4}</think> done", Off, Ok("4")),
            ("<think>a</think><think>\\boxed{4}</think>", Off, Err(NotFound::Nothing("none"))),
            ("<think>\\boxed{3}</think>\\boxed{4}</think>\\boxed{5}", Off, Ok("5")),
            ("\\boxed{\\frac{1}{2}}", Off, Ok("\\frac{1}{2}")),
            ("\\boxed{\\{1,2\\}}", Off, Ok("\\{1,2\\}")),
            ("\\boxed{unbalanced", Off, Err(NotFound::BadBox)),
            ("\\boxed{}", Off, Err(NotFound::BadBox)),
            ("Final Answer: The final answer is $(0, 1)$. I hope it is correct.", Off, Ok("$(0, 1)$")),
            ("Final Answer: The largest $n$ is 34.", Off, Ok("34")),
            ("Answer: 42", Off, Ok("42")),
            // After a marker the first answer counts, and alternatives are hedging.
            ("The answer is 5, not 4", Off, Ok("5")),
            ("The answer is: **5**", Off, Ok("5")),
            ("The answer is 5 or maybe 4.", Off, Ok("5; 4")),
            ("The answer is $5$, or perhaps $4$.", Off, Ok("5; 4")),
            ("Final answer: 12 ways, since 3 times 4 is 12.", Off, Ok("12")),
            ("the number is not 10 which is 1,000.99€", Last, Ok("1000.99")),
            ("Soucis : 2,74 $ a..", Last, Ok("2.74")),
            ("AZYUK2A", Last, Err(NotFound::Nothing("last"))),
            ("28 %", Last, Ok("28 %")),
            ("is 2/3. <|im_start|>user 5", Last, Ok("2/3")),
            ("we get $x = 5$ so", Last, Ok("x = 5")),
            ("just 5 here", Off, Err(NotFound::Nothing("none"))),
            // Boxes and markers compete by position: the last stated answer wins.
            (
                "so \\boxed{255} in the working.\n\nFinal Answer: The final answer is $10,455$. I hope it is correct.",
                Off,
                Ok("$10,455$"),
            ),
            ("The answer is \\boxed{12}. The answer is correct because $3 \\times 4 = 12$.", Off, Ok("12")),
            ("\\boxed{4}\n\nFinal Answer: I hope it is correct.", Off, Ok("4")),
            ("\\boxed{6}. So the answer is 6 or 7.", Off, Ok("6 or 7")),
            // GSM8K's `####` states a bare value; a Markdown heading states none.
            ("48+24 = <<48+24=72>>72 clips.\n#### 72", Off, Ok("72")),
            ("#### 1,000\nthanks", Off, Ok("1,000")),
            ("#### Step 2: add 3", Off, Err(NotFound::Nothing("none"))),
        ];
        for (completion, fallback, expected) in cases {
            check(completion, *fallback, expected.clone());
        }
    }

    #[test]
    fn gold_answers() {
        let cases: &[(&str, &str)] = &[
            ("\\frac{1}{2}", "\\frac{1}{2}"),
            ("so \\boxed{4} is it", "4"),
            ("She sold 48/2 = <<48/2=24>>24 clips.\n#### 72", "72"),
            ("#### Heading\nno answer", "#### Heading\nno answer"),
        ];
        for (gold, expected) in cases {
            assert_eq!(extract_gold(gold).answer, *expected, "{gold:?}");
        }
    }

    #[test]
    fn prompt_echo_is_not_graded() {
        let prompt = "What is 2+2? Answer: \\boxed{4}";
        let got = extract("What is 2+2? Answer: \\boxed{4}", prompt, Fallback::None);
        assert!(got.is_err(), "{got:?}");
    }
}
