//! Python `str` and `re` semantics that IFEval's checks depend on, in Rust.
//!
//! The reference implementation is Python: `str.strip()`, `str.isupper()`, `\s` and `\w` there are
//! not quite Rust's `trim`, `is_uppercase` and regex classes. Each difference below changes a
//! verdict on some input, so the checks use these helpers instead of the Rust defaults.

use std::sync::OnceLock;

use regex::Regex;

/// Python's `str.isspace` for one character: Unicode `White_Space` plus U+001C..U+001F, which Python
/// counts as whitespace (they are bidirectional class B/S) and Rust does not.
pub fn is_space(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// The characters Python's `string.whitespace` holds: the ASCII ones only.
pub fn is_ascii_space(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\n' | '\r' | '\x0b' | '\x0c')
}

/// Python's `str.strip()` with no argument.
pub fn strip(text: &str) -> &str {
    text.trim_matches(is_space)
}

/// Python's `str.split()` with no argument: runs of whitespace separate, empty pieces dropped.
pub fn split_whitespace(text: &str) -> impl Iterator<Item = &str> {
    text.split(is_space).filter(|piece| !piece.is_empty())
}

/// A character Python's `\w` matches in a `str` pattern: `str.isalnum()` (letters of every
/// category L*, and N* numerics) or `_`. Unlike Rust's `\w` this excludes combining marks, so a
/// Devanagari vowel sign ends a Python word.
pub fn is_word(c: char) -> bool {
    if c.is_ascii() {
        return c == '_' || c.is_ascii_alphanumeric();
    }
    // Rust's `is_alphanumeric` also takes `Other_Alphabetic` marks; only categories L* and N* count.
    static WORD: OnceLock<Regex> = OnceLock::new();
    c.is_alphanumeric()
        && WORD
            .get_or_init(|| Regex::new(r"^[\p{L}\p{N}]$").expect("valid regex"))
            .is_match(c.encode_utf8(&mut [0; 4]))
}

/// The regex class for one Python `\w` character, for patterns written here.
pub const WORD_CLASS: &str = r"[\p{L}\p{N}_]";

/// The regex class for one Python `\s` character, for patterns written here.
pub const SPACE_CLASS: &str = r"[\s\x1c-\x1f]";

/// Titlecase letters (general category Lt), which Python's `isupper`/`islower` treat as neither.
const TITLECASE: &[char] = &[
    '\u{1c5}', '\u{1c8}', '\u{1cb}', '\u{1f2}', '\u{1f88}', '\u{1f89}', '\u{1f8a}', '\u{1f8b}', '\u{1f8c}',
    '\u{1f8d}', '\u{1f8e}', '\u{1f8f}', '\u{1f98}', '\u{1f99}', '\u{1f9a}', '\u{1f9b}', '\u{1f9c}',
    '\u{1f9d}', '\u{1f9e}', '\u{1f9f}', '\u{1fa8}', '\u{1fa9}', '\u{1faa}', '\u{1fab}', '\u{1fac}',
    '\u{1fad}', '\u{1fae}', '\u{1faf}', '\u{1fbc}', '\u{1fcc}', '\u{1ffc}',
];

fn is_title(c: char) -> bool {
    TITLECASE.contains(&c)
}

/// Python's `str.isupper()`: no lowercase or titlecase character, and at least one uppercase one.
pub fn is_upper(text: &str) -> bool {
    let mut cased = false;
    for c in text.chars() {
        if c.is_lowercase() || is_title(c) {
            return false;
        }
        cased |= c.is_uppercase();
    }
    cased
}

/// Python's `str.islower()`: no uppercase or titlecase character, and at least one lowercase one.
pub fn is_lower(text: &str) -> bool {
    let mut cased = false;
    for c in text.chars() {
        if c.is_uppercase() || is_title(c) {
            return false;
        }
        cased |= c.is_lowercase();
    }
    cased
}

/// Whether `text` is a document Python's `json.loads` accepts (the C scanner of CPython's `json`
/// module, `strict=True`): one value with optional ASCII whitespace around it, where the
/// literals `NaN`, `Infinity` and `-Infinity` are values too, numbers are ASCII, strings hold no
/// raw control characters and any `\uXXXX` escape (lone surrogates included) is allowed.
///
/// Iterative with an explicit stack, so a deeply nested document costs memory linear in its
/// length and never overflows the call stack.
pub fn is_python_json(text: &str) -> bool {
    let mut parser = JsonScan { bytes: text.as_bytes(), pos: 0 };
    parser.document()
}

struct JsonScan<'a> {
    bytes: &'a [u8],
    pos: usize,
}

#[derive(Clone, Copy, PartialEq)]
enum Frame {
    /// Inside an array.
    ArrayValue,
    /// Inside an object, after `{` (first) or `,` (not first): a key must come.
    ObjectKey { first: bool },
    /// Inside an object, after a value: `,` or `}`.
    ObjectNext,
}

impl JsonScan<'_> {
    fn peek(&self) -> Option<u8> {
        self.bytes.get(self.pos).copied()
    }

    fn skip_ws(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.pos += 1;
        }
    }

    fn eat(&mut self, literal: &[u8]) -> bool {
        if self.bytes[self.pos..].starts_with(literal) {
            self.pos += literal.len();
            true
        } else {
            false
        }
    }

    fn document(&mut self) -> bool {
        self.skip_ws();
        let mut stack: Vec<Frame> = Vec::new();
        loop {
            // Expect a value here (possibly an empty container's close, handled below).
            self.skip_ws();
            match self.peek() {
                Some(b'[') => {
                    self.pos += 1;
                    self.skip_ws();
                    if self.peek() == Some(b']') {
                        self.pos += 1;
                    } else {
                        stack.push(Frame::ArrayValue);
                        continue;
                    }
                }
                Some(b'{') => {
                    self.pos += 1;
                    stack.push(Frame::ObjectKey { first: true });
                    match self.object_key(&mut stack) {
                        Some(true) => continue,
                        // `{` then `}`: an empty object is a complete value.
                        Some(false) => {}
                        None => return false,
                    }
                }
                _ => {
                    if !self.scalar() {
                        return false;
                    }
                }
            }
            // After a complete value: close containers or move to the next element.
            loop {
                self.skip_ws();
                match stack.last().copied() {
                    None => {
                        return self.pos == self.bytes.len();
                    }
                    Some(Frame::ArrayValue) => match self.peek() {
                        Some(b',') => {
                            self.pos += 1;
                            *stack.last_mut().expect("non-empty") = Frame::ArrayValue;
                            break;
                        }
                        Some(b']') => {
                            self.pos += 1;
                            stack.pop();
                        }
                        _ => return false,
                    },
                    Some(Frame::ObjectNext | Frame::ObjectKey { .. }) => match self.peek() {
                        Some(b',') => {
                            self.pos += 1;
                            *stack.last_mut().expect("non-empty") = Frame::ObjectKey { first: false };
                            if self.object_key(&mut stack) != Some(true) {
                                return false;
                            }
                            break;
                        }
                        Some(b'}') => {
                            self.pos += 1;
                            stack.pop();
                        }
                        _ => return false,
                    },
                }
            }
        }
    }

    /// Reads `"key" :` for the object on top of the stack: `Some(true)` when a value must follow
    /// (the frame is then `ObjectNext`), `Some(false)` when `}` closed an empty object (its frame
    /// popped), `None` on a syntax error.
    fn object_key(&mut self, stack: &mut Vec<Frame>) -> Option<bool> {
        self.skip_ws();
        let first = matches!(stack.last(), Some(Frame::ObjectKey { first: true }));
        if first && self.peek() == Some(b'}') {
            self.pos += 1;
            stack.pop();
            return Some(false);
        }
        if self.peek() != Some(b'"') || !self.string() {
            return None;
        }
        self.skip_ws();
        if self.peek() != Some(b':') {
            return None;
        }
        self.pos += 1;
        *stack.last_mut().expect("object frame") = Frame::ObjectNext;
        Some(true)
    }

    fn scalar(&mut self) -> bool {
        match self.peek() {
            Some(b'"') => self.string(),
            Some(b'n') => self.eat(b"null"),
            Some(b't') => self.eat(b"true"),
            Some(b'f') => self.eat(b"false"),
            Some(b'N') => self.eat(b"NaN"),
            Some(b'I') => self.eat(b"Infinity"),
            Some(b'-') if self.bytes[self.pos..].starts_with(b"-Infinity") => self.eat(b"-Infinity"),
            Some(b'-' | b'0'..=b'9') => self.number(),
            _ => false,
        }
    }

    fn digits(&mut self) -> usize {
        let start = self.pos;
        while matches!(self.peek(), Some(b'0'..=b'9')) {
            self.pos += 1;
        }
        self.pos - start
    }

    fn number(&mut self) -> bool {
        if self.peek() == Some(b'-') {
            self.pos += 1;
        }
        match self.peek() {
            Some(b'0') => self.pos += 1,
            Some(b'1'..=b'9') => {
                self.digits();
            }
            _ => return false,
        }
        // A fraction or exponent without digits is not part of the number: CPython then stops the
        // number before it, and the document fails on the leftover character.
        if self.peek() == Some(b'.') && matches!(self.bytes.get(self.pos + 1), Some(b'0'..=b'9')) {
            self.pos += 1;
            self.digits();
        }
        if matches!(self.peek(), Some(b'e' | b'E')) {
            let save = self.pos;
            self.pos += 1;
            if matches!(self.peek(), Some(b'+' | b'-')) {
                self.pos += 1;
            }
            if self.digits() == 0 {
                self.pos = save;
            }
        }
        true
    }

    fn string(&mut self) -> bool {
        self.pos += 1; // the opening quote
        loop {
            match self.peek() {
                None => return false,
                Some(b'"') => {
                    self.pos += 1;
                    return true;
                }
                Some(b'\\') => {
                    self.pos += 1;
                    match self.peek() {
                        Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => self.pos += 1,
                        Some(b'u') => {
                            let hex = self.bytes.get(self.pos + 1..self.pos + 5);
                            if !hex.is_some_and(|hex| hex.iter().all(u8::is_ascii_hexdigit)) {
                                return false;
                            }
                            self.pos += 5;
                        }
                        _ => return false,
                    }
                }
                Some(byte) if byte < 0x20 => return false,
                Some(_) => self.pos += 1,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_case_predicates() {
        let cases: &[(&str, bool, bool)] = &[
            // (text, isupper, islower)
            ("HELLO", true, false),
            ("HELLO, WORLD 123!", true, false),
            ("hello", false, true),
            ("Hello", false, false),
            ("123 !?", false, false),
            ("", false, false),
            ("ÉCOLE", true, false),
            ("ǅ", false, false),
            ("I", true, false),
            ("N'T", true, false),
        ];
        for (text, upper, lower) in cases {
            assert_eq!((is_upper(text), is_lower(text)), (*upper, *lower), "{text:?}");
        }
    }

    #[test]
    fn python_strip_includes_information_separators() {
        assert_eq!(strip("\u{1c} a \u{1f}\u{a0}"), "a");
        assert_eq!(split_whitespace(" a\u{1d}b  c ").collect::<Vec<_>>(), ["a", "b", "c"]);
    }

    #[test]
    fn python_word_characters_exclude_marks() {
        assert!(is_word('a') && is_word('_') && is_word('٣') && is_word('中'));
        // U+093F DEVANAGARI VOWEL SIGN I is a mark: Python's \w does not match it.
        assert!(!is_word('\u{93f}'));
        assert!(!is_word('-') && !is_word(' '));
    }

    #[test]
    fn json_as_python_reads_it() {
        let cases: &[(&str, bool)] = &[
            ("{}", true),
            ("[]", true),
            (" {\"a\": [1, 2.5, -3e10, true, false, null]} ", true),
            ("123", true),
            ("\"text\"", true),
            ("NaN", true),
            ("[Infinity, -Infinity]", true),
            ("{\"a\": NaN}", true),
            ("\"\\ud800\"", true),
            ("1e400", true),
            ("{\"a\": {\"b\": {}}, \"c\": []}", true),
            ("[{}, [], {\"x\": [{}]}]", true),
            ("{\"a\": {}, \"b\": 1}", true),
            ("", false),
            ("{", false),
            ("{\"a\" 1}", false),
            ("{\"a\": 1,}", false),
            ("[1,]", false),
            ("[1 2]", false),
            ("{'a': 1}", false),
            ("01", false),
            ("1.", false),
            ("1e", false),
            (".5", false),
            ("+1", false),
            ("nan", false),
            ("\"tab\there\"", false),
            ("\"bad \\x escape\"", false),
            ("{} {}", false),
            ("\u{feff}{}", false),
            ("{\"a\":1}\u{a0}", false),
            ("{1: 2}", false),
        ];
        for (text, expected) in cases {
            assert_eq!(is_python_json(text), *expected, "{text:?}");
        }
        let deep = "[".repeat(100_000) + &"]".repeat(100_000);
        assert!(is_python_json(&deep));
    }
}
