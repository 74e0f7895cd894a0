//! Tokens of the LaTeX/plain answer language, with the repairs that real completions need.
//!
//! The lexer is where formatting noise disappears: `$`, `\(`, `\left`, thin spaces, `\displaystyle`
//! and friends are skipped; thousands separators (`1,000`, `14{,}916`, `11,\! 111`, `1 000`) are
//! folded into one number; JSON mis-escapes of backslash commands (a form feed where `\frac`
//! was meant, `\\frac` written twice) are repaired.

use num_bigint::BigInt;
use num_rational::BigRational;
use num_traits::{One, Zero};

use crate::budget::{Budget, Exhausted};

/// A numeric literal as written.
#[derive(Debug, Clone, PartialEq)]
pub struct Number {
    /// Its exact value.
    pub value: BigRational,
    /// Whether it was written with a decimal point or an exponent (`0.5`, `1e-3`): such a literal
    /// may be a rounded approximation of a non-terminating value.
    pub decimal: bool,
    /// Decimal places it was written with (for `1.25e1`, one).
    pub places: u32,
    /// The digits as written, without separators, when it is a plain integer literal (so an
    /// unbraced `\frac94` can take its arguments one digit at a time).
    pub raw: Option<String>,
}

/// A relation between two sides.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RelOp {
    /// `=`
    Eq,
    /// `\ne`
    Ne,
    /// `<`
    Lt,
    /// `\le`
    Le,
    /// `>`
    Gt,
    /// `\ge`
    Ge,
    /// `\approx`
    Approx,
    /// `\in`
    In,
}

impl RelOp {
    /// The relation with its sides swapped (`a < b` is `b > a`).
    pub fn flipped(self) -> RelOp {
        match self {
            RelOp::Lt => RelOp::Gt,
            RelOp::Le => RelOp::Ge,
            RelOp::Gt => RelOp::Lt,
            RelOp::Ge => RelOp::Le,
            other => other,
        }
    }

    /// How it is written in plain text.
    pub fn symbol(self) -> &'static str {
        match self {
            RelOp::Eq => "=",
            RelOp::Ne => "!=",
            RelOp::Lt => "<",
            RelOp::Le => "<=",
            RelOp::Gt => ">",
            RelOp::Ge => ">=",
            RelOp::Approx => "~",
            RelOp::In => "in",
        }
    }
}

/// One token.
#[derive(Debug, Clone, PartialEq)]
pub enum Tok {
    /// A number.
    Num(Number),
    /// A run of ASCII letters (`x`, `sin`, `or`, `cm`).
    Letters(String),
    /// A backslash command that is a symbol or an operator the parser looks up by name
    /// (`frac`, `sqrt`, `pi`, `alpha`, `cup`, ...).
    Cmd(String),
    /// The raw content of `\text{…}` and its kin.
    Text(String),
    /// A relation.
    Rel(RelOp),
    /// A single punctuation or operator character: `+ - * / ^ _ ! , ; : | ' & %`.
    Op(char),
    /// `(`
    LParen,
    /// `)`
    RParen,
    /// `[`
    LBrack,
    /// `]`
    RBrack,
    /// `{`
    LBrace,
    /// `}`
    RBrace,
    /// `\{`
    LSet,
    /// `\}`
    RSet,
    /// `\\` (a row break in matrices)
    RowSep,
    /// `^\circ`, `°`
    Degree,
}

/// Why text could not be tokenized.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum LexError {
    /// The work budget ran out.
    #[error(transparent)]
    Exhausted(#[from] Exhausted),
    /// A character the answer language does not know.
    #[error("unexpected character {0:?}")]
    Unexpected(char),
    /// A `\text{` or similar group that never closes.
    #[error("unclosed {0} group")]
    Unclosed(&'static str),
}

/// Commands that produce no token: spacing, sizing, delimiters of math mode.
const SKIPPED: &[&str] = &[
    "left",
    "right",
    "big",
    "Big",
    "bigg",
    "Bigg",
    "bigl",
    "bigr",
    "Bigl",
    "Bigr",
    "biggl",
    "biggr",
    "Biggl",
    "Biggr",
    "middle",
    "displaystyle",
    "textstyle",
    "scriptstyle",
    "quad",
    "qquad",
    "limits",
    "nolimits",
    "hfill",
    "cr",
    "nonumber",
    "notag",
    "relax",
    "medskip",
    "smallskip",
    "bigskip",
    "noindent",
    "mathord",
    "boldsymbol",
    "bm",
    "mathbb",
    "mathcal",
    "mathscr",
    "mathfrak",
    "mathop",
    "underline",
    "overline",
    "vec",
    "hat",
    "bar",
    "tilde",
    "widehat",
    "overrightarrow",
    "ensuremath",
    "color",
    "textcolor",
];

/// Commands whose brace argument is text, not math.
const TEXT_COMMANDS: &[&str] = &[
    "text",
    "textbf",
    "textit",
    "textrm",
    "textnormal",
    "textsf",
    "texttt",
    "textup",
    "mbox",
    "hbox",
    "mathrm",
    "mathbf",
    "mathit",
    "mathsf",
    "mathtt",
    "operatorname",
    "emph",
    "textmd",
    "rm",
    "bf",
];

/// Commands whose brace argument is dropped (layout only).
const DROPPED_WITH_ARG: &[&str] = &["hspace", "vspace", "label", "tag", "phantom", "hphantom", "vphantom"];

/// Every command name the parser knows (used to repair mangled escapes and glued names).
const KNOWN: &[&str] = &[
    "frac",
    "dfrac",
    "tfrac",
    "cfrac",
    "sqrt",
    "pi",
    "infty",
    "infinity",
    "cdot",
    "times",
    "div",
    "pm",
    "mp",
    "le",
    "leq",
    "leqslant",
    "ge",
    "geq",
    "geqslant",
    "ne",
    "neq",
    "lt",
    "gt",
    "approx",
    "in",
    "cup",
    "cap",
    "setminus",
    "circ",
    "degree",
    "boxed",
    "fbox",
    "begin",
    "end",
    "binom",
    "dbinom",
    "tbinom",
    "sin",
    "cos",
    "tan",
    "sec",
    "csc",
    "cot",
    "arcsin",
    "arccos",
    "arctan",
    "sinh",
    "cosh",
    "tanh",
    "ln",
    "log",
    "exp",
    "lg",
    "max",
    "min",
    "gcd",
    "lcm",
    "det",
    "alpha",
    "beta",
    "gamma",
    "delta",
    "epsilon",
    "varepsilon",
    "zeta",
    "eta",
    "theta",
    "vartheta",
    "iota",
    "kappa",
    "lambda",
    "mu",
    "nu",
    "xi",
    "rho",
    "sigma",
    "tau",
    "upsilon",
    "phi",
    "varphi",
    "chi",
    "psi",
    "omega",
    "Gamma",
    "Delta",
    "Theta",
    "Lambda",
    "Xi",
    "Pi",
    "Sigma",
    "Phi",
    "Psi",
    "Omega",
    "emptyset",
    "varnothing",
    "prime",
    "land",
    "lor",
    "wedge",
    "vee",
    "text",
    "textbf",
    "textit",
    "textrm",
    "textnormal",
    "mbox",
    "mathrm",
    "mathbf",
    "operatorname",
    "quad",
    "qquad",
    "left",
    "right",
    "displaystyle",
    "dots",
    "ldots",
    "cdots",
    "to",
    "rightarrow",
    "implies",
    "iff",
    "percent",
    "lfloor",
    "rfloor",
    "lceil",
    "rceil",
    "langle",
    "rangle",
    "vert",
    "mid",
    "neg",
    "not",
    "sum",
    "prod",
    "int",
    "lim",
    "hline",
    "hspace",
    "tfrac",
    "mathit",
    "emph",
    "hbox",
    "big",
    "Big",
];

/// Repairs completions whose backslashes went through one JSON escape too few or too many: a
/// form feed, backspace, tab or carriage return followed by letters that complete a known
/// command (`\f` + `rac`), and `\\` directly followed by a known command name.
pub fn repair_escapes(text: &str) -> String {
    let mut fixed = String::with_capacity(text.len());
    let chars: Vec<char> = text.chars().collect();
    for (i, &c) in chars.iter().enumerate() {
        let letter = match c {
            '\x0c' => 'f',
            '\x08' => 'b',
            '\t' => 't',
            '\r' => 'r',
            '\x0b' => 'v',
            _ => {
                fixed.push(c);
                continue;
            }
        };
        let word: String = std::iter::once(letter)
            .chain(chars[i + 1..].iter().take_while(|c| c.is_ascii_alphabetic()).copied())
            .collect();
        if known_prefix(&word).is_some() {
            fixed.push('\\');
            fixed.push(letter);
        } else {
            fixed.push(' ');
        }
    }
    let chars: Vec<char> = fixed.chars().collect();
    let mut out = String::with_capacity(fixed.len());
    let mut i = 0;
    while i < chars.len() {
        if chars[i] == '\\' && chars.get(i + 1) == Some(&'\\') {
            let word: String = chars[i + 2..].iter().take_while(|c| c.is_ascii_alphabetic()).collect();
            out.push_str(if known_prefix(&word).is_some() { "\\" } else { "\\\\" });
            i += 2;
            continue;
        }
        out.push(chars[i]);
        i += 1;
    }
    out
}

/// The longest known command name that `word` starts with.
fn known_prefix(word: &str) -> Option<&'static str> {
    KNOWN.iter().copied().filter(|name| word.starts_with(name)).max_by_key(|name| name.len())
}

/// Tokenizes `text`, charging one unit per character and the cost of every number's conversion.
pub fn tokenize(text: &str, budget: &mut Budget) -> Result<Vec<Tok>, LexError> {
    let chars: Vec<char> = text.chars().collect();
    budget.charge(chars.len() as u64, "tokenizing")?;
    let mut lexer = Lexer { chars, pos: 0, out: Vec::new(), depth: 0 };
    lexer.run(budget)?;
    Ok(lexer.out)
}

struct Lexer {
    chars: Vec<char>,
    pos: usize,
    out: Vec<Tok>,
    /// Open `(`, `[` and `\{`: inside them a bare comma separates items, never thousands.
    depth: i32,
}

impl Lexer {
    fn peek(&self, offset: usize) -> Option<char> {
        self.chars.get(self.pos + offset).copied()
    }

    fn rest_starts_with(&self, offset: usize, s: &str) -> bool {
        s.chars().enumerate().all(|(k, c)| self.chars.get(self.pos + offset + k) == Some(&c))
    }

    fn run(&mut self, budget: &mut Budget) -> Result<(), LexError> {
        while let Some(c) = self.peek(0) {
            match c {
                c if c.is_whitespace() || c == '$' || c == '~' => self.pos += 1,
                '\\' => self.command(budget)?,
                c if c.is_ascii_digit() => self.number(budget)?,
                '.' if self.peek(1).is_some_and(|d| d.is_ascii_digit()) => self.number(budget)?,
                c if c.is_ascii_alphabetic() => {
                    let start = self.pos;
                    while self.peek(0).is_some_and(|c| c.is_ascii_alphabetic()) {
                        self.pos += 1;
                    }
                    let word: String = self.chars[start..self.pos].iter().collect();
                    self.out.push(Tok::Letters(word));
                }
                _ => {
                    self.pos += 1;
                    self.symbol(c)?;
                }
            }
        }
        Ok(())
    }

    fn symbol(&mut self, c: char) -> Result<(), LexError> {
        let tok = match c {
            '(' => {
                self.depth += 1;
                Tok::LParen
            }
            ')' => {
                self.depth -= 1;
                Tok::RParen
            }
            '[' => {
                self.depth += 1;
                Tok::LBrack
            }
            ']' => {
                self.depth -= 1;
                Tok::RBrack
            }
            '{' => Tok::LBrace,
            '}' => Tok::RBrace,
            '<' if self.peek(0) == Some('=') => {
                self.pos += 1;
                Tok::Rel(RelOp::Le)
            }
            '>' if self.peek(0) == Some('=') => {
                self.pos += 1;
                Tok::Rel(RelOp::Ge)
            }
            '!' if self.peek(0) == Some('=') => {
                self.pos += 1;
                Tok::Rel(RelOp::Ne)
            }
            '=' if self.peek(0) == Some('=') => {
                self.pos += 1;
                Tok::Rel(RelOp::Eq)
            }
            '*' if self.peek(0) == Some('*') => {
                self.pos += 1;
                Tok::Op('^')
            }
            '<' => Tok::Rel(RelOp::Lt),
            '>' => Tok::Rel(RelOp::Gt),
            '=' => Tok::Rel(RelOp::Eq),
            '≤' | '⩽' => Tok::Rel(RelOp::Le),
            '≥' | '⩾' => Tok::Rel(RelOp::Ge),
            '≠' => Tok::Rel(RelOp::Ne),
            '≈' => Tok::Rel(RelOp::Approx),
            '∈' => Tok::Rel(RelOp::In),
            '+' | '-' | '*' | '/' | '^' | '_' | '!' | ',' | ';' | ':' | '|' | '\'' | '&' | '%' => Tok::Op(c),
            '−' | '–' => Tok::Op('-'),
            '×' | '·' | '⋅' => Tok::Cmd("cdot".into()),
            '÷' => Tok::Cmd("div".into()),
            '±' => Tok::Cmd("pm".into()),
            '∓' => Tok::Cmd("mp".into()),
            'π' => Tok::Cmd("pi".into()),
            '∞' => Tok::Cmd("infty".into()),
            '∪' => Tok::Cmd("cup".into()),
            '∩' => Tok::Cmd("cap".into()),
            '√' => Tok::Cmd("sqrt".into()),
            '°' => Tok::Degree,
            '²' => {
                self.out.push(Tok::Op('^'));
                Tok::Num(int_number(2))
            }
            '³' => {
                self.out.push(Tok::Op('^'));
                Tok::Num(int_number(3))
            }
            // Currency signs and typographic noise around numbers.
            '€' | '£' | '¥' | '"' | '`' | '?' => return Ok(()),
            other => return Err(LexError::Unexpected(other)),
        };
        self.out.push(tok);
        Ok(())
    }

    fn command(&mut self, budget: &mut Budget) -> Result<(), LexError> {
        let Some(next) = self.peek(1) else {
            self.pos += 1;
            return Ok(());
        };
        if !next.is_ascii_alphabetic() {
            self.pos += 2;
            let tok = match next {
                '\\' => Tok::RowSep,
                '{' => {
                    self.depth += 1;
                    Tok::LSet
                }
                '}' => {
                    self.depth -= 1;
                    Tok::RSet
                }
                '|' => Tok::Op('|'),
                '%' => Tok::Op('%'),
                // `\,` `\;` `\:` `\!` `\ ` `\>` spacing, `\(` `\)` `\[` `\]` math delimiters, `\$`.
                _ => return Ok(()),
            };
            self.out.push(tok);
            return Ok(());
        }
        let start = self.pos + 1;
        let mut end = start;
        while self.chars.get(end).is_some_and(|c| c.is_ascii_alphabetic()) {
            end += 1;
        }
        let mut name: String = self.chars[start..end].iter().collect();
        if !KNOWN.contains(&name.as_str())
            && !SKIPPED.contains(&name.as_str())
            && !TEXT_COMMANDS.contains(&name.as_str())
            && !DROPPED_WITH_ARG.contains(&name.as_str())
        {
            // `\quadx`, `\pix`: a known command glued to the letters after it.
            if let Some(prefix) = known_prefix(&name) {
                end = start + prefix.len();
                name = prefix.to_owned();
            }
        }
        self.pos = end;
        let name = name.as_str();
        if SKIPPED.contains(&name) {
            if name == "color" || name == "textcolor" {
                self.skip_group();
            }
            return Ok(());
        }
        if DROPPED_WITH_ARG.contains(&name) {
            self.skip_spaces();
            if self.peek(0) == Some('*') {
                self.pos += 1;
            }
            self.skip_group();
            return Ok(());
        }
        if TEXT_COMMANDS.contains(&name) {
            self.skip_spaces();
            if self.peek(0) == Some('{') {
                let content = self.raw_group("\\text")?;
                budget.charge(content.len() as u64, "tokenizing")?;
                self.out.push(Tok::Text(content));
            }
            return Ok(());
        }
        let tok = match name {
            "le" | "leq" | "leqslant" => Tok::Rel(RelOp::Le),
            "ge" | "geq" | "geqslant" => Tok::Rel(RelOp::Ge),
            "lt" => Tok::Rel(RelOp::Lt),
            "gt" => Tok::Rel(RelOp::Gt),
            "ne" | "neq" => Tok::Rel(RelOp::Ne),
            "approx" => Tok::Rel(RelOp::Approx),
            "in" => Tok::Rel(RelOp::In),
            "circ" | "degree" => Tok::Degree,
            "percent" => Tok::Op('%'),
            "vert" | "mid" => Tok::Op('|'),
            "prime" => Tok::Op('\''),
            "dfrac" | "tfrac" | "cfrac" => Tok::Cmd("frac".into()),
            "dbinom" | "tbinom" => Tok::Cmd("binom".into()),
            "infinity" => Tok::Cmd("infty".into()),
            "varnothing" => Tok::Cmd("emptyset".into()),
            "varepsilon" => Tok::Cmd("epsilon".into()),
            "lfloor" | "rfloor" | "lceil" | "rceil" | "langle" | "rangle" => Tok::Cmd(name.into()),
            _ => Tok::Cmd(name.into()),
        };
        self.out.push(tok);
        Ok(())
    }

    fn skip_spaces(&mut self) {
        while self.peek(0).is_some_and(char::is_whitespace) {
            self.pos += 1;
        }
    }

    /// Skips a balanced `{…}` group if one starts here.
    fn skip_group(&mut self) {
        if self.peek(0) != Some('{') {
            return;
        }
        let mut depth = 0usize;
        while let Some(c) = self.peek(0) {
            self.pos += 1;
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        return;
                    }
                }
                _ => {}
            }
        }
    }

    /// The raw text of a balanced `{…}` group starting here (without its braces).
    fn raw_group(&mut self, what: &'static str) -> Result<String, LexError> {
        let start = self.pos + 1;
        let mut depth = 0usize;
        while let Some(c) = self.peek(0) {
            self.pos += 1;
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        return Ok(self.chars[start..self.pos - 1].iter().collect());
                    }
                }
                _ => {}
            }
        }
        Err(LexError::Unclosed(what))
    }

    /// The length of a thousands separator at `offset` followed by exactly three digits, if any.
    fn thousands_separator(&self, offset: usize) -> Option<usize> {
        // `{,}`, `,\!`, `\,` and kin may have spaces around them; a bare comma may not (`32, 349`
        // is two numbers) and only outside brackets; a bare space only once.
        let separators: &[&str] = &["{,}", "{, }", ",\\!", "\\,", "\\ ", "\\!", "{ }"];
        let mut at = offset;
        while self.peek(at) == Some(' ') && at < offset + 2 {
            at += 1;
        }
        let mut len = None;
        if let Some(sep) = separators.iter().find(|sep| self.rest_starts_with(at, sep)) {
            let mut end = at + sep.chars().count();
            while self.peek(end) == Some(' ') && end < at + sep.len() + 2 {
                end += 1;
            }
            len = Some(end - offset);
        } else if self.peek(offset) == Some(',') && self.depth <= 0 || self.peek(offset) == Some(' ') {
            len = Some(1);
        }
        let len = len?;
        let digits = offset + len;
        let three = (0..3).all(|k| self.peek(digits + k).is_some_and(|c| c.is_ascii_digit()));
        let ends = !self.peek(digits + 3).is_some_and(|c| c.is_ascii_digit());
        (three && ends).then_some(len)
    }

    /// Whether a bare comma right here is a decimal comma (ISO 80000-1 allows the comma as the
    /// decimal sign) rather than a thousands separator or a list separator. Only where no other
    /// reading is plausible, outside brackets: after a lone `0` (`0,111`: no thousands group
    /// starts with 0; `-0,5`: no list starts with −0), before a fraction that starts with `0` (`3,05`: no list item is written
    /// `05`), or after an integer part that cannot lead a thousands group — four or more
    /// ungrouped digits (`1000,99`) or one grouped by spaces (`1 000,5`) — unless three digits
    /// follow (`1234,567` stays the list 1234, 567). A short integer part before one, two or
    /// four digits stays a list (`2,5` and `0,5` are answers 2 and 5, 0 and 5).
    fn decimal_comma(&self, lead: &str, ungrouped: bool, grouped_without_comma: bool) -> bool {
        if self.peek(0) != Some(',') || self.depth > 0 {
            return false;
        }
        let mut fraction = 0;
        while self.peek(1 + fraction).is_some_and(|c| c.is_ascii_digit()) {
            fraction += 1;
        }
        if fraction == 0 {
            return false;
        }
        let starts_with_zero = self.peek(1) == Some('0');
        let negative = self.out.last() == Some(&Tok::Op('-'));
        (lead == "0" && ungrouped && (fraction >= 2 || negative))
            || (starts_with_zero && fraction >= 2)
            || (fraction != 3 && ((ungrouped && lead.len() >= 4) || grouped_without_comma))
    }

    fn number(&mut self, budget: &mut Budget) -> Result<(), LexError> {
        let mut digits = String::new();
        while let Some(c) = self.peek(0).filter(char::is_ascii_digit) {
            digits.push(c);
            self.pos += 1;
        }
        let lead = digits.len();
        // Whether the integer part was grouped by something other than a comma (`1 000`, `1\,000`).
        let mut grouped_without_comma = false;
        if (1..=3).contains(&digits.len()) && !(digits.starts_with('0')) {
            // Thousands groups: only when every group after the first has exactly three digits,
            // and never after a leading zero (`0,111` is no thousand).
            while let Some(len) = self.thousands_separator(0) {
                grouped_without_comma |= !self.chars[self.pos..self.pos + len].contains(&',');
                self.pos += len;
                for _ in 0..3 {
                    digits.push(self.chars[self.pos]);
                    self.pos += 1;
                }
            }
        }
        let mut places = 0u32;
        let mut decimal = false;
        let decimal_comma = self.decimal_comma(&digits[..lead], lead == digits.len(), grouped_without_comma);
        if (self.peek(0) == Some('.') || decimal_comma) && self.peek(1).is_some_and(|c| c.is_ascii_digit()) {
            self.pos += 1;
            decimal = true;
            while let Some(c) = self.peek(0).filter(char::is_ascii_digit) {
                digits.push(c);
                places += 1;
                self.pos += 1;
            }
        }
        let mut exponent: i64 = 0;
        if matches!(self.peek(0), Some('e' | 'E')) {
            let sign_len = usize::from(matches!(self.peek(1), Some('+' | '-')));
            let mut k = 1 + sign_len;
            let mut exp_digits = String::new();
            while let Some(c) = self.peek(k).filter(char::is_ascii_digit) {
                exp_digits.push(c);
                k += 1;
            }
            let followed_by_letter = self.peek(k).is_some_and(|c| c.is_ascii_alphabetic());
            if !exp_digits.is_empty() && !followed_by_letter && exp_digits.len() <= 12 {
                let magnitude: i64 = exp_digits.parse().unwrap_or(i64::MAX);
                exponent = if self.peek(1) == Some('-') { -magnitude } else { magnitude };
                decimal = true;
                self.pos += k;
            }
        }
        let value = decimal_value(&digits, places, exponent, budget)?;
        let places = (i64::from(places) - exponent).clamp(0, i64::from(u32::MAX)) as u32;
        let raw = (!decimal).then_some(digits);
        self.out.push(Tok::Num(Number { value, decimal, places, raw }));
        Ok(())
    }
}

/// An integer literal.
pub fn int_number(n: i64) -> Number {
    Number {
        value: BigRational::from_integer(BigInt::from(n)),
        decimal: false,
        places: 0,
        raw: Some(n.to_string()),
    }
}

/// `digits × 10^(exponent − places)` exactly, charging the conversion and the power.
fn decimal_value(
    digits: &str,
    places: u32,
    exponent: i64,
    budget: &mut Budget,
) -> Result<BigRational, Exhausted> {
    let limbs = digits.len() as u64 / 19 + 1;
    budget.charge(limbs.saturating_mul(limbs), "a long number")?;
    let mantissa = digits.parse::<BigInt>().unwrap_or_else(|_| BigInt::zero());
    let shift = exponent - i64::from(places);
    if mantissa.is_zero() {
        return Ok(BigRational::zero());
    }
    let power = pow10(shift.unsigned_abs(), budget)?;
    Ok(if shift >= 0 {
        BigRational::from_integer(mantissa * power)
    } else {
        BigRational::new(mantissa, power)
    })
}

/// `10^n`, charged by the size of the result.
pub fn pow10(n: u64, budget: &mut Budget) -> Result<BigInt, Exhausted> {
    // 10^n has about 3.33 n bits; squaring-based pow costs about (bits/64)^2.
    let limbs = n.saturating_mul(4) / 64 + 1;
    budget.charge(limbs.saturating_mul(limbs), "a power of ten")?;
    let exp = u32::try_from(n).map_err(|_| Exhausted { limit: 0, what: "a power of ten" })?;
    Ok(num_traits::pow(BigInt::from(10), exp as usize).max(BigInt::one()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn numbers(text: &str) -> Vec<String> {
        let mut budget = Budget::new(1_000_000);
        tokenize(text, &mut budget)
            .unwrap()
            .into_iter()
            .filter_map(|tok| match tok {
                Tok::Num(n) => Some(format!("{}{}", n.value, if n.decimal { "~" } else { "" })),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn thousands_and_decimals() {
        let cases: &[(&str, &[&str])] = &[
            ("7,425,000", &["7425000"]),
            ("14{,}916", &["14916"]),
            ("14 {, }916", &["14916"]),
            ("11,\\! 111,\\! 111,\\! 100", &["11111111100"]),
            ("32, 349", &["32", "349"]),
            ("1 000", &["1000"]),
            ("(1,000)", &["1", "0"]),
            ("21,16,11", &["21", "16", "11"]),
            ("1,000.99", &["100099/100~"]),
            ("1e-3", &["1/1000~"]),
            ("2e", &["2"]),
            ("0.50", &["1/2~"]),
            ("1234,567", &["1234", "567"]),
            // Decimal commas, only where no thousands or list reading is plausible.
            ("1000,99", &["100099/100~"]),
            ("0,111", &["111/1000~"]),
            ("3,05", &["61/20~"]),
            ("1 000,5", &["2001/2~"]),
            ("2,5", &["2", "5"]),
            ("0,5", &["0", "5"]),
            ("-0,5", &["1/2~"]),
            ("1,234", &["1234"]),
            ("(1000,99)", &["1000", "99"]),
        ];
        for (text, expected) in cases {
            assert_eq!(numbers(text), *expected, "{text}");
        }
    }

    #[test]
    fn escapes_are_repaired() {
        assert_eq!(repair_escapes("-\\\x0crac{7}{4}"), "-\\frac{7}{4}");
        assert_eq!(repair_escapes("\\\\frac{1}{2}"), "\\frac{1}{2}");
        assert_eq!(repair_escapes("1\\\\2"), "1\\\\2");
        assert_eq!(repair_escapes("\x0crac12"), "\\frac12");
    }
}
