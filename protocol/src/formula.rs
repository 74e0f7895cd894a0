//! A job's reward as a formula over its named graders (`[reward] formula`): `0.7 * math + 0.3 *
//! format`, `min(a, b)`, a gate `format > 0 ? math : 0`. Parsed once at submit, where every
//! refusal names the term and its column, and evaluated per completion by the worker and by the
//! daemon's dry-run (`POST /v1/verify`) — the same parse and the same arithmetic on both sides.
//!
//! Hand-written rather than an expression crate's: the grammar is a dozen rules, every name must
//! resolve to one of the job's graders at parse time (so evaluation cannot fail on a name), and
//! a tenant's text must be bounded in length and nesting before it is parsed.
//!
//! Grammar, loosest first (C's precedence):
//! ```text
//! formula  := choice
//! choice   := or ( "?" choice ":" choice )?
//! or       := and ( "||" and )*
//! and      := compare ( "&&" compare )*
//! compare  := sum ( ( "<" | "<=" | ">" | ">=" | "==" | "!=" ) sum )?
//! sum      := product ( ( "+" | "-" ) product )*
//! product  := unary ( ( "*" | "/" ) unary )*
//! unary    := ( "-" | "!" ) unary | atom
//! atom     := number | grader | function "(" formula ( "," formula )* ")" | "(" formula ")"
//! ```
//! A comparison, `&&`, `||` and `!` give 1 or 0; a value is true when it is not 0. Functions:
//! `min`, `max` (one or more arguments), `abs(x)`, `clamp(x, low, high)`. A grader's value is its
//! score; a grader that answered with an error counts as 0 there (its error is logged with the
//! completion, as for a weighted sum).
//!
//! `spec::check_graders` is the one check of a list of graders and their formula, for a job's
//! `[[verifiers]]` and a dry-run's body alike.

/// The longest formula a spec may write, in characters.
pub const MAX_CHARS: usize = 1024;
/// The deepest nesting of parentheses, calls and operators' operands.
const MAX_DEPTH: usize = 64;

/// A parsed formula whose names are indices into the graders it was parsed against.
#[derive(Debug, Clone, PartialEq)]
pub struct Formula {
    expr: Expr,
    /// Indices of the graders the formula reads, ascending, each once.
    uses: Vec<usize>,
}

/// Why a formula was refused: the term, where it starts (1-based column, in characters), and
/// what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("at column {column}, `{term}`: {message}")]
pub struct FormulaError {
    pub column: usize,
    pub term: String,
    pub message: String,
}

/// A value that is not a number (a division by zero, an overflow).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the reward formula gave {value} (not a finite number)")]
pub struct EvalError {
    pub value: String,
}

#[derive(Debug, Clone, PartialEq)]
enum Expr {
    Number(f64),
    Grader(usize),
    Negate(Box<Expr>),
    Not(Box<Expr>),
    Binary(BinaryOp, Box<Expr>, Box<Expr>),
    Choice(Box<Expr>, Box<Expr>, Box<Expr>),
    Call(Function, Vec<Expr>),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BinaryOp {
    Add,
    Subtract,
    Multiply,
    Divide,
    Less,
    LessEqual,
    Greater,
    GreaterEqual,
    Equal,
    NotEqual,
    And,
    Or,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Function {
    Min,
    Max,
    Abs,
    Clamp,
}

impl Function {
    const ALL: [(&'static str, Function); 4] =
        [("min", Function::Min), ("max", Function::Max), ("abs", Function::Abs), ("clamp", Function::Clamp)];

    /// The number of arguments it takes: exactly, or at least (`None` upper bound).
    fn arity(self) -> (usize, Option<usize>) {
        match self {
            Function::Min | Function::Max => (1, None),
            Function::Abs => (1, Some(1)),
            Function::Clamp => (3, Some(3)),
        }
    }
}

impl Formula {
    /// Parses `text` against the job's grader names (in the job's order): every name the text
    /// uses must be one of them.
    pub fn parse(text: &str, graders: &[&str]) -> Result<Formula, FormulaError> {
        let chars = text.chars().count();
        if chars > MAX_CHARS {
            return Err(FormulaError {
                column: MAX_CHARS + 1,
                term: text.chars().skip(MAX_CHARS).take(16).collect(),
                message: format!("the formula is {chars} characters; at most {MAX_CHARS}"),
            });
        }
        let tokens = tokenize(text)?;
        if tokens.is_empty() {
            return Err(FormulaError {
                column: 1,
                term: String::new(),
                message: "the formula is empty".into(),
            });
        }
        let mut parser = Parser { tokens: &tokens, at: 0, graders, uses: Vec::new(), depth: 0 };
        let expr = parser.choice()?;
        if let Some(token) = parser.peek() {
            return Err(token.error("expected an operator or the end of the formula"));
        }
        let mut uses = parser.uses;
        uses.sort_unstable();
        uses.dedup();
        Ok(Formula { expr, uses })
    }

    /// The indices (into the names it was parsed against) of the graders the formula reads.
    pub fn uses(&self) -> &[usize] {
        &self.uses
    }

    /// The reward, given each grader's score in the order the formula was parsed against.
    pub fn evaluate(&self, scores: &[f64]) -> Result<f64, EvalError> {
        let value = eval(&self.expr, scores);
        if value.is_finite() { Ok(value) } else { Err(EvalError { value: value.to_string() }) }
    }
}

fn truth(value: f64) -> f64 {
    if value != 0.0 && !value.is_nan() { 1.0 } else { 0.0 }
}

fn eval(expr: &Expr, scores: &[f64]) -> f64 {
    match expr {
        Expr::Number(value) => *value,
        // Parse resolved every index against the same list.
        Expr::Grader(index) => scores.get(*index).copied().unwrap_or(f64::NAN),
        Expr::Negate(inner) => -eval(inner, scores),
        Expr::Not(inner) => 1.0 - truth(eval(inner, scores)),
        Expr::Choice(condition, then, otherwise) => {
            if truth(eval(condition, scores)) == 1.0 {
                eval(then, scores)
            } else {
                eval(otherwise, scores)
            }
        }
        Expr::Binary(op, left, right) => {
            let a = eval(left, scores);
            // `&&` and `||` short-circuit, as they read.
            match op {
                BinaryOp::And if truth(a) == 0.0 => return 0.0,
                BinaryOp::Or if truth(a) == 1.0 => return 1.0,
                _ => {}
            }
            let b = eval(right, scores);
            let flag = |yes: bool| if yes { 1.0 } else { 0.0 };
            match op {
                BinaryOp::Add => a + b,
                BinaryOp::Subtract => a - b,
                BinaryOp::Multiply => a * b,
                BinaryOp::Divide => a / b,
                BinaryOp::Less => flag(a < b),
                BinaryOp::LessEqual => flag(a <= b),
                BinaryOp::Greater => flag(a > b),
                BinaryOp::GreaterEqual => flag(a >= b),
                BinaryOp::Equal => flag(a == b),
                BinaryOp::NotEqual => flag(a != b),
                BinaryOp::And | BinaryOp::Or => truth(b),
            }
        }
        Expr::Call(function, args) => {
            let mut values = args.iter().map(|arg| eval(arg, scores));
            match function {
                Function::Min => values.fold(f64::INFINITY, f64::min),
                Function::Max => values.fold(f64::NEG_INFINITY, f64::max),
                Function::Abs => values.next().unwrap_or(f64::NAN).abs(),
                Function::Clamp => {
                    let (x, low, high) = (
                        values.next().unwrap_or(f64::NAN),
                        values.next().unwrap_or(f64::NAN),
                        values.next().unwrap_or(f64::NAN),
                    );
                    if low > high { f64::NAN } else { x.max(low).min(high) }
                }
            }
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Kind {
    Number(f64),
    Name(String),
    Op(&'static str),
}

#[derive(Debug, Clone)]
struct Token {
    kind: Kind,
    /// 1-based column of its first character.
    column: usize,
    text: String,
}

impl Token {
    fn error(&self, message: impl Into<String>) -> FormulaError {
        FormulaError { column: self.column, term: self.text.clone(), message: message.into() }
    }
}

/// Longest first, so `<=` is not `<` then `=`.
const OPERATORS: [&str; 17] =
    ["<=", ">=", "==", "!=", "&&", "||", "+", "-", "*", "/", "<", ">", "!", "?", ":", "(", ")"];

fn tokenize(text: &str) -> Result<Vec<Token>, FormulaError> {
    let chars: Vec<char> = text.chars().collect();
    let mut tokens = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let column = i + 1;
        if c.is_whitespace() {
            i += 1;
        } else if c.is_ascii_digit() || (c == '.' && chars.get(i + 1).is_some_and(char::is_ascii_digit)) {
            let start = i;
            while i < chars.len() && (chars[i].is_ascii_digit() || chars[i] == '.') {
                i += 1;
            }
            // An exponent: `1e-3`.
            if i < chars.len() && matches!(chars[i], 'e' | 'E') {
                let mut j = i + 1;
                if j < chars.len() && matches!(chars[j], '+' | '-') {
                    j += 1;
                }
                if j < chars.len() && chars[j].is_ascii_digit() {
                    i = j;
                    while i < chars.len() && chars[i].is_ascii_digit() {
                        i += 1;
                    }
                }
            }
            let text: String = chars[start..i].iter().collect();
            let value = text
                .parse::<f64>()
                .ok()
                .filter(|value| value.is_finite())
                .ok_or_else(|| FormulaError { column, term: text.clone(), message: "not a number".into() })?;
            tokens.push(Token { kind: Kind::Number(value), column, text });
        } else if c.is_ascii_alphabetic() || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            let text: String = chars[start..i].iter().collect();
            tokens.push(Token { kind: Kind::Name(text.clone()), column, text });
        } else if c == ',' {
            tokens.push(Token { kind: Kind::Op(","), column, text: ",".into() });
            i += 1;
        } else {
            let rest: String = chars[i..chars.len().min(i + 2)].iter().collect();
            let Some(op) = OPERATORS.iter().find(|op| rest.starts_with(**op)) else {
                return Err(FormulaError {
                    column,
                    term: c.to_string(),
                    message: "unexpected character (a formula has numbers, grader names, + - * /, \
                              comparisons, && || !, ? :, parentheses and min max abs clamp)"
                        .into(),
                });
            };
            tokens.push(Token { kind: Kind::Op(op), column, text: (*op).to_owned() });
            i += op.chars().count();
        }
    }
    Ok(tokens)
}

struct Parser<'a> {
    tokens: &'a [Token],
    at: usize,
    graders: &'a [&'a str],
    uses: Vec<usize>,
    depth: usize,
}

impl Parser<'_> {
    fn peek(&self) -> Option<&Token> {
        self.tokens.get(self.at)
    }

    fn peek_op(&self) -> Option<&'static str> {
        match self.peek()?.kind {
            Kind::Op(op) => Some(op),
            _ => None,
        }
    }

    fn next(&mut self) -> Option<Token> {
        let token = self.tokens.get(self.at).cloned();
        self.at += 1;
        token
    }

    /// An error at the end of the formula, or at the next token.
    fn expected(&self, what: &str) -> FormulaError {
        match self.peek() {
            Some(token) => token.error(format!("expected {what}")),
            None => {
                let column = self.tokens.last().map_or(1, |t| t.column + t.text.chars().count());
                FormulaError {
                    column,
                    term: String::new(),
                    message: format!("expected {what}, found the end"),
                }
            }
        }
    }

    fn expect(&mut self, op: &'static str) -> Result<(), FormulaError> {
        if self.peek_op() == Some(op) {
            self.at += 1;
            Ok(())
        } else {
            Err(self.expected(&format!("`{op}`")))
        }
    }

    fn deeper(&mut self) -> Result<(), FormulaError> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            let token = self.peek().cloned();
            let (column, term) = token.map_or((1, String::new()), |t| (t.column, t.text));
            return Err(FormulaError { column, term, message: format!("nested deeper than {MAX_DEPTH}") });
        }
        Ok(())
    }

    fn choice(&mut self) -> Result<Expr, FormulaError> {
        self.deeper()?;
        let condition = self.binary(0)?;
        let expr = if self.peek_op() == Some("?") {
            self.at += 1;
            let then = self.choice()?;
            self.expect(":")?;
            let otherwise = self.choice()?;
            Expr::Choice(Box::new(condition), Box::new(then), Box::new(otherwise))
        } else {
            condition
        };
        self.depth -= 1;
        Ok(expr)
    }

    /// The binary levels, loosest first; a comparison does not chain (`a < b < c` is refused).
    fn binary(&mut self, level: usize) -> Result<Expr, FormulaError> {
        const LEVELS: [&[(&str, BinaryOp)]; 5] = [
            &[("||", BinaryOp::Or)],
            &[("&&", BinaryOp::And)],
            &[
                ("<", BinaryOp::Less),
                ("<=", BinaryOp::LessEqual),
                (">", BinaryOp::Greater),
                (">=", BinaryOp::GreaterEqual),
                ("==", BinaryOp::Equal),
                ("!=", BinaryOp::NotEqual),
            ],
            &[("+", BinaryOp::Add), ("-", BinaryOp::Subtract)],
            &[("*", BinaryOp::Multiply), ("/", BinaryOp::Divide)],
        ];
        const COMPARE: usize = 2;
        let Some(ops) = LEVELS.get(level) else { return self.unary() };
        self.deeper()?;
        let mut left = self.binary(level + 1)?;
        let mut compared = false;
        while let Some(op) = self.peek_op().and_then(|op| ops.iter().find(|(text, _)| *text == op)) {
            if level == COMPARE && compared {
                return Err(self.peek().expect("peeked").error("comparisons do not chain; use &&"));
            }
            self.at += 1;
            let right = self.binary(level + 1)?;
            left = Expr::Binary(op.1, Box::new(left), Box::new(right));
            compared = true;
        }
        self.depth -= 1;
        Ok(left)
    }

    fn unary(&mut self) -> Result<Expr, FormulaError> {
        self.deeper()?;
        let expr = match self.peek_op() {
            Some("-") => {
                self.at += 1;
                Expr::Negate(Box::new(self.unary()?))
            }
            Some("!") => {
                self.at += 1;
                Expr::Not(Box::new(self.unary()?))
            }
            _ => self.atom()?,
        };
        self.depth -= 1;
        Ok(expr)
    }

    fn atom(&mut self) -> Result<Expr, FormulaError> {
        let Some(token) = self.next() else {
            self.at -= 1;
            return Err(self.expected("a number, a grader's name or `(`"));
        };
        match &token.kind {
            Kind::Number(value) => Ok(Expr::Number(*value)),
            Kind::Op("(") => {
                let inner = self.choice()?;
                self.expect(")")?;
                Ok(inner)
            }
            Kind::Name(name) if self.peek_op() == Some("(") => {
                let Some((_, function)) = Function::ALL.iter().find(|(known, _)| known == name) else {
                    return Err(token.error("unknown function (functions: min, max, abs, clamp)"));
                };
                self.at += 1;
                let mut args = vec![self.choice()?];
                while self.peek_op() == Some(",") {
                    self.at += 1;
                    args.push(self.choice()?);
                }
                self.expect(")")?;
                let (least, most) = function.arity();
                if args.len() < least || most.is_some_and(|most| args.len() > most) {
                    let wanted = match most {
                        Some(most) if most == least => format!("{least}"),
                        _ => format!("at least {least}"),
                    };
                    return Err(token.error(format!("takes {wanted} argument(s), got {}", args.len())));
                }
                Ok(Expr::Call(*function, args))
            }
            Kind::Name(name) => match self.graders.iter().position(|grader| grader == name) {
                Some(index) => {
                    self.uses.push(index);
                    Ok(Expr::Grader(index))
                }
                None => {
                    let known = if self.graders.is_empty() { "none".into() } else { self.graders.join(", ") };
                    Err(token.error(format!("not a grader of this reward (graders: {known})")))
                }
            },
            Kind::Op(_) => Err(token.error("expected a number, a grader's name or `(`")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GRADERS: &[&str] = &["math", "format", "judge_1"];

    #[test]
    fn evaluates() {
        // (formula, scores of math, format, judge_1, reward)
        let cases: &[(&str, [f64; 3], f64)] = &[
            ("0.7 * math + 0.3 * format", [1.0, 1.0, 0.0], 1.0),
            ("0.7 * math + 0.3 * format", [0.0, 1.0, 0.0], 0.3),
            ("min(math, format)", [1.0, 0.5, 0.0], 0.5),
            ("max(math, format, judge_1)", [0.0, 0.5, 0.75], 0.75),
            ("format > 0 ? math : 0", [1.0, 0.0, 0.0], 0.0),
            ("format > 0 ? math : 0", [1.0, 1.0, 0.0], 1.0),
            ("format > 0 ? math : format < 0 ? -1 : 0.5", [1.0, -1.0, 0.0], -1.0),
            ("math && format", [1.0, 0.5, 0.0], 1.0),
            ("math || !format", [0.0, 0.0, 0.0], 1.0),
            ("-math + 2 * (format - 1)", [1.0, 1.0, 0.0], -1.0),
            ("clamp(math + format, 0, 1.5)", [1.0, 1.0, 0.0], 1.5),
            ("abs(judge_1 - 1)", [0.0, 0.0, 0.25], 0.75),
            ("1e-1 * math", [1.0, 0.0, 0.0], 0.1),
            ("math == 1 && format != 0", [1.0, 0.2, 0.0], 1.0),
            ("8 / 2 / 2", [0.0; 3], 2.0),
            ("2 - 1 - 1", [0.0; 3], 0.0),
        ];
        for (text, scores, want) in cases {
            let formula = Formula::parse(text, GRADERS).unwrap_or_else(|e| panic!("{text}: {e}"));
            let got = formula.evaluate(scores).unwrap();
            assert!((got - want).abs() < 1e-12, "{text} on {scores:?}: got {got}, want {want}");
        }
    }

    #[test]
    fn records_the_graders_it_reads() {
        let formula = Formula::parse("judge_1 > 0 ? math : math / 2", GRADERS).unwrap();
        assert_eq!(formula.uses(), &[0, 2]);
    }

    #[test]
    fn refusals_name_the_term_and_column() {
        let cases: &[(&str, &str)] = &[
            (
                "0.7 * math + 0.3 * fromat",
                "at column 20, `fromat`: not a grader of this reward (graders: math, format, judge_1)",
            ),
            ("", "at column 1, ``: the formula is empty"),
            ("math +", "at column 7, ``: expected a number, a grader's name or `(`, found the end"),
            (
                "math $ format",
                "at column 6, `$`: unexpected character (a formula has numbers, grader names, + - * /, comparisons, && || !, ? :, parentheses and min max abs clamp)",
            ),
            ("sqrt(math)", "at column 1, `sqrt`: unknown function (functions: min, max, abs, clamp)"),
            ("clamp(math, 0)", "at column 1, `clamp`: takes 3 argument(s), got 2"),
            ("min()", "at column 5, `)`: expected a number, a grader's name or `(`"),
            ("(math", "at column 6, ``: expected `)`, found the end"),
            ("math format", "at column 6, `format`: expected an operator or the end of the formula"),
            ("format > 0 ? math", "at column 18, ``: expected `:`, found the end"),
            ("0 < math < 1", "at column 10, `<`: comparisons do not chain; use &&"),
            ("1.2.3", "at column 1, `1.2.3`: not a number"),
            (
                "math.correct",
                "at column 5, `.`: unexpected character (a formula has numbers, grader names, + - * /, comparisons, && || !, ? :, parentheses and min max abs clamp)",
            ),
        ];
        for (text, want) in cases {
            let got = Formula::parse(text, GRADERS).expect_err(text).to_string();
            assert_eq!(&got, want, "{text}");
        }
    }

    #[test]
    fn hostile_text_is_bounded() {
        let deep = format!("{}math{}", "(".repeat(10_000), ")".repeat(10_000));
        assert!(Formula::parse(&deep, GRADERS).unwrap_err().message.contains("at most 1024"));
        let nested = format!("{}math{}", "(".repeat(200), ")".repeat(200));
        assert!(Formula::parse(&nested, GRADERS).unwrap_err().message.contains("nested deeper"));
        let negations = format!("{}math", "-".repeat(500));
        assert!(Formula::parse(&negations, GRADERS).unwrap_err().message.contains("nested deeper"));
        // Not a panic on any byte soup.
        for text in ["?:", ")(", ",", "min(,)", "!", "1e", "1e+", ".5.", "é", "a?b:c?d", "((((", "1/0"] {
            let _ = Formula::parse(text, GRADERS).map(|f| f.evaluate(&[0.0; 3]));
        }
    }

    #[test]
    fn a_value_that_is_not_a_number_is_an_error() {
        let formula = Formula::parse("math / format", GRADERS).unwrap();
        assert_eq!(formula.evaluate(&[1.0, 0.0, 0.0]).unwrap_err().value, "inf");
        assert!(formula.evaluate(&[0.0, 0.0, 0.0]).is_err());
        let formula = Formula::parse("clamp(math, 1, 0)", GRADERS).unwrap();
        assert!(formula.evaluate(&[0.5, 0.0, 0.0]).is_err());
    }
}
