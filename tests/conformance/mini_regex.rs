//! A small backtracking regular-expression engine for `$match` and `string:pattern(...)`.
//!
//! Supported: literals, `.`, escapes (`\d \D \w \W \s \S` and escaped punctuation), classes
//! `[a-z0-9_]` / `[^...]` (with the same escapes inside), groups `(...)` / `(?:...)`, alternation
//! `|`, quantifiers `* + ? {n} {n,} {n,m}` (a trailing `?` for laziness is accepted; it does not
//! change whether a match exists), anchors `^` and `$`. Matching is a search (unanchored unless
//! the pattern uses anchors), like Go's `MatchString`. Anything else is a parse error, never a
//! silent mismatch.

#[derive(Debug, Clone)]
enum Node {
    Char(char),
    Any,
    Class {
        ranges: Vec<(char, char)>,
        negated: bool,
    },
    Start,
    End,
    Concat(Vec<Node>),
    Alt(Vec<Node>),
    Repeat {
        node: Box<Node>,
        min: usize,
        max: Option<usize>,
    },
}

#[derive(Debug, Clone)]
pub struct Regex {
    node: Node,
}

impl Regex {
    pub fn new(pattern: &str) -> Result<Regex, String> {
        let chars: Vec<char> = pattern.chars().collect();
        let mut parser = Parser {
            chars: &chars,
            pos: 0,
        };
        let node = parser.alternation()?;
        if parser.pos != chars.len() {
            return Err(format!(
                "invalid regex {pattern:?}: unexpected {:?}",
                chars[parser.pos]
            ));
        }
        Ok(Regex { node })
    }

    /// True if the pattern matches anywhere in `text`.
    pub fn is_match(&self, text: &str) -> bool {
        let input: Vec<char> = text.chars().collect();
        (0..=input.len()).any(|start| match_node(&self.node, &input, start, &mut |_| true))
    }
}

struct Parser<'a> {
    chars: &'a [char],
    pos: usize,
}

impl Parser<'_> {
    fn peek(&self) -> Option<char> {
        self.chars.get(self.pos).copied()
    }

    fn next(&mut self) -> Option<char> {
        let c = self.peek();
        if c.is_some() {
            self.pos += 1;
        }
        c
    }

    fn alternation(&mut self) -> Result<Node, String> {
        let mut branches = vec![self.concat()?];
        while self.peek() == Some('|') {
            self.pos += 1;
            branches.push(self.concat()?);
        }
        Ok(if branches.len() == 1 {
            branches.remove(0)
        } else {
            Node::Alt(branches)
        })
    }

    fn concat(&mut self) -> Result<Node, String> {
        let mut items = Vec::new();
        while let Some(c) = self.peek() {
            if c == '|' || c == ')' {
                break;
            }
            let atom = self.atom()?;
            items.push(self.quantified(atom)?);
        }
        Ok(Node::Concat(items))
    }

    fn quantified(&mut self, atom: Node) -> Result<Node, String> {
        let save = self.pos;
        let (min, max) = match self.next() {
            Some('*') => (0, None),
            Some('+') => (1, None),
            Some('?') => (0, Some(1)),
            Some('{') => match self.braces() {
                Some(bounds) => bounds,
                None => {
                    // Not a repetition: '{' is a literal, parsed as the next atom.
                    self.pos = save;
                    return Ok(atom);
                }
            },
            _ => {
                self.pos = save;
                return Ok(atom);
            }
        };
        if matches!(atom, Node::Start | Node::End) {
            return Err("quantifier after an anchor".to_string());
        }
        if self.peek() == Some('?') {
            self.pos += 1; // lazy: same match existence
        }
        if let Some(max) = max
            && max < min
        {
            return Err(format!("bad repetition {{{min},{max}}}"));
        }
        Ok(Node::Repeat {
            node: Box::new(atom),
            min,
            max,
        })
    }

    /// Parses `n}`, `n,}` or `n,m}` after a '{'; None if it is not a repetition.
    fn braces(&mut self) -> Option<(usize, Option<usize>)> {
        let min = self.number()?;
        let max = if self.peek() == Some(',') {
            self.pos += 1;
            if self.peek() == Some('}') {
                None
            } else {
                Some(self.number()?)
            }
        } else {
            Some(min)
        };
        if self.next() != Some('}') {
            return None;
        }
        Some((min, max))
    }

    fn number(&mut self) -> Option<usize> {
        let start = self.pos;
        while self.peek().is_some_and(|c| c.is_ascii_digit()) {
            self.pos += 1;
        }
        self.chars[start..self.pos]
            .iter()
            .collect::<String>()
            .parse()
            .ok()
    }

    fn atom(&mut self) -> Result<Node, String> {
        let c = self.next().ok_or("unexpected end of pattern")?;
        match c {
            '.' => Ok(Node::Any),
            '^' => Ok(Node::Start),
            '$' => Ok(Node::End),
            '(' => {
                if self.chars[self.pos..].starts_with(&['?', ':']) {
                    self.pos += 2;
                } else if self.peek() == Some('?') {
                    return Err("unsupported group syntax (?...)".to_string());
                }
                let inner = self.alternation()?;
                if self.next() != Some(')') {
                    return Err("missing ')'".to_string());
                }
                Ok(inner)
            }
            '[' => self.class(),
            '\\' => self.escape(),
            '*' | '+' | '?' => Err(format!("nothing to repeat before {c:?}")),
            other => Ok(Node::Char(other)),
        }
    }

    fn escape(&mut self) -> Result<Node, String> {
        let c = self.next().ok_or("trailing backslash")?;
        Ok(match escape_class(c) {
            Some((ranges, negated)) => Node::Class { ranges, negated },
            None => Node::Char(escape_char(c)?),
        })
    }

    fn class(&mut self) -> Result<Node, String> {
        let mut negated = false;
        if self.peek() == Some('^') {
            negated = true;
            self.pos += 1;
        }
        let mut ranges = Vec::new();
        let mut first = true;
        loop {
            let c = self.next().ok_or("missing ']'")?;
            if c == ']' && !first {
                break;
            }
            first = false;
            let lo = if c == '\\' {
                let e = self.next().ok_or("trailing backslash")?;
                if let Some((mut rs, neg)) = escape_class(e) {
                    if neg {
                        return Err("negated escape class inside [...] is unsupported".to_string());
                    }
                    ranges.append(&mut rs);
                    continue;
                }
                escape_char(e)?
            } else {
                c
            };
            if self.peek() == Some('-') && self.chars.get(self.pos + 1).is_some_and(|&n| n != ']') {
                self.pos += 1;
                let mut hi = self.next().ok_or("missing ']'")?;
                if hi == '\\' {
                    hi = escape_char(self.next().ok_or("trailing backslash")?)?;
                }
                if hi < lo {
                    return Err(format!("bad class range {lo}-{hi}"));
                }
                ranges.push((lo, hi));
            } else {
                ranges.push((lo, lo));
            }
        }
        Ok(Node::Class { ranges, negated })
    }
}

fn escape_class(c: char) -> Option<(Vec<(char, char)>, bool)> {
    let digits = vec![('0', '9')];
    let word = vec![('a', 'z'), ('A', 'Z'), ('0', '9'), ('_', '_')];
    let space = vec![(' ', ' '), ('\t', '\r')];
    match c {
        'd' => Some((digits, false)),
        'D' => Some((digits, true)),
        'w' => Some((word, false)),
        'W' => Some((word, true)),
        's' => Some((space, false)),
        'S' => Some((space, true)),
        _ => None,
    }
}

fn escape_char(c: char) -> Result<char, String> {
    match c {
        'n' => Ok('\n'),
        't' => Ok('\t'),
        'r' => Ok('\r'),
        c if c.is_ascii_punctuation() => Ok(c),
        c => Err(format!("unsupported escape \\{c}")),
    }
}

fn class_has(ranges: &[(char, char)], negated: bool, c: char) -> bool {
    ranges.iter().any(|&(lo, hi)| lo <= c && c <= hi) != negated
}

/// Matches `node` at `pos`, calling `k` with each possible end position until it returns true.
fn match_node(node: &Node, input: &[char], pos: usize, k: &mut dyn FnMut(usize) -> bool) -> bool {
    match node {
        Node::Char(c) => input.get(pos) == Some(c) && k(pos + 1),
        Node::Any => input.get(pos).is_some_and(|&c| c != '\n') && k(pos + 1),
        Node::Class { ranges, negated } => {
            input
                .get(pos)
                .is_some_and(|&c| class_has(ranges, *negated, c))
                && k(pos + 1)
        }
        Node::Start => pos == 0 && k(pos),
        Node::End => pos == input.len() && k(pos),
        Node::Concat(items) => match_seq(items, input, pos, k),
        Node::Alt(branches) => branches.iter().any(|b| match_node(b, input, pos, k)),
        Node::Repeat { node, min, max } => match_repeat(node, *min, *max, 0, input, pos, k),
    }
}

fn match_seq(items: &[Node], input: &[char], pos: usize, k: &mut dyn FnMut(usize) -> bool) -> bool {
    match items.split_first() {
        None => k(pos),
        Some((first, rest)) => match_node(first, input, pos, &mut |p| match_seq(rest, input, p, k)),
    }
}

fn match_repeat(
    node: &Node,
    min: usize,
    max: Option<usize>,
    count: usize,
    input: &[char],
    pos: usize,
    k: &mut dyn FnMut(usize) -> bool,
) -> bool {
    let can_more = max.is_none_or(|m| count < m);
    // Greedy: try one more repetition first (only if it consumes input, to avoid looping).
    if can_more
        && match_node(node, input, pos, &mut |p| {
            (p > pos || count < min) && match_repeat(node, min, max, count + 1, input, p, k)
        })
    {
        return true;
    }
    count >= min && k(pos)
}

#[cfg(test)]
mod tests {
    use super::Regex;

    fn m(p: &str, t: &str) -> bool {
        Regex::new(p).expect("valid test pattern").is_match(t)
    }

    #[test]
    fn regex_literals_and_search() {
        assert!(m("json", "application/json"));
        assert!(m(
            "application/(openjobspec\\+)?json",
            "application/openjobspec+json"
        ));
        assert!(m(
            "application/(openjobspec\\+)?json",
            "application/json; charset=utf-8"
        ));
        assert!(!m("application/(openjobspec\\+)?json", "text/plain"));
    }

    #[test]
    fn regex_anchors_classes_counts() {
        let v7 = "^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$";
        assert!(m(v7, "01890a5d-ac96-774b-bcce-b302099a8057"));
        assert!(!m(v7, "01890a5d-ac96-474b-bcce-b302099a8057"));
        assert!(!m(v7, "x01890a5d-ac96-774b-bcce-b302099a8057"));
        assert!(m("^\\d{2,3}$", "123"));
        assert!(!m("^\\d{2,3}$", "1234"));
        assert!(m("^a|b$", "xxb"));
        assert!(m("^(ab)+c*$", "ababcc"));
        assert!(!m("^(ab)+$", "aba"));
        assert!(m("^[^x]*$", "abc"));
        assert!(!m("^[^x]*$", "axc"));
        assert!(m("^test\\..*", "test.echo"));
        assert!(m("^(a*)*$", "aaaa"));
        assert!(m("^\\w+\\s\\w+$", "hello world"));
    }

    #[test]
    fn regex_rejects_unsupported() {
        assert!(Regex::new("(?=a)").is_err());
        assert!(Regex::new("a)").is_err());
        assert!(Regex::new("[a").is_err());
        assert!(Regex::new("*a").is_err());
        assert!(Regex::new("\\q").is_err());
    }
}
