//! The one rule that turns a contract's name (an operationId, a schema, property, parameter or
//! header name) into a Rust identifier; every generated name goes through [`ident`].
//!
//! The name is cut into words at every character that is not an ASCII letter or digit, and before
//! an upper-case letter that follows a lower-case letter or digit or that begins a capitalised word
//! after an acronym: `enqueueJob` is `enqueue Job`, `Last-Event-ID` is `Last Event ID`,
//! `HTTPError` is `HTTP Error`, `job_id` is `job id`. The words are then joined in the case asked
//! for. A keyword becomes a raw identifier (`r#type`); the few that cannot be raw (`self`, `Self`,
//! `super`, `crate`) get a trailing `_`; a leading digit gets a leading `_`.

use proc_macro2::{Ident, Span};

use crate::BuildResult;

/// The case of the identifier.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Case {
    /// `snake_case`: functions, fields, parameters.
    Snake,
    /// `PascalCase`: types and enum variants.
    Pascal,
}

/// Rust's keywords (strict and reserved, edition 2024).
const KEYWORDS: &[&str] = &[
    "abstract", "as", "async", "await", "become", "box", "break", "const", "continue", "crate",
    "do", "dyn", "else", "enum", "extern", "false", "final", "fn", "for", "gen", "if", "impl",
    "in", "let", "loop", "macro", "match", "mod", "move", "mut", "override", "priv", "pub", "ref",
    "return", "self", "Self", "static", "struct", "super", "trait", "true", "try", "type",
    "typeof", "unsafe", "unsized", "use", "virtual", "where", "while", "yield",
];

/// Keywords that cannot be raw identifiers.
const NOT_RAW: &[&str] = &["self", "Self", "super", "crate"];

/// The words of `name` (see the module documentation).
fn words(name: &str) -> Vec<&str> {
    let mut words = Vec::new();
    for run in name.split(|c: char| !c.is_ascii_alphanumeric()) {
        let bytes = run.as_bytes();
        let mut start = 0;
        for i in 1..bytes.len() {
            let (prev, here) = (bytes[i - 1], bytes[i]);
            let next_lower = bytes.get(i + 1).is_some_and(u8::is_ascii_lowercase);
            let boundary = here.is_ascii_uppercase()
                && (prev.is_ascii_lowercase()
                    || prev.is_ascii_digit()
                    || (prev.is_ascii_uppercase() && next_lower));
            if boundary {
                words.push(&run[start..i]);
                start = i;
            }
        }
        if start < run.len() {
            words.push(&run[start..]);
        }
    }
    words
}

/// The identifier for `name` in `case`; an error if `name` has no letter or digit.
pub fn ident(name: &str, case: Case) -> BuildResult<Ident> {
    let words = words(name);
    if words.is_empty() {
        return Err(format!("`{name}` has no letter or digit to make a Rust identifier of").into());
    }
    let mut text = match case {
        Case::Snake => words
            .iter()
            .map(|w| w.to_ascii_lowercase())
            .collect::<Vec<_>>()
            .join("_"),
        Case::Pascal => words
            .iter()
            .map(|w| {
                let lower = w.to_ascii_lowercase();
                let mut chars = lower.chars();
                chars.next().map_or_else(String::new, |first| {
                    first.to_ascii_uppercase().to_string() + chars.as_str()
                })
            })
            .collect(),
    };
    if text.starts_with(|c: char| c.is_ascii_digit()) {
        text.insert(0, '_');
    }
    Ok(if NOT_RAW.contains(&text.as_str()) {
        Ident::new(&format!("{text}_"), Span::call_site())
    } else if KEYWORDS.contains(&text.as_str()) {
        Ident::new_raw(&text, Span::call_site())
    } else {
        Ident::new(&text, Span::call_site())
    })
}

/// Fails when two names of `what` (e.g. "the properties of `Job`") make the same identifier.
pub fn distinct<'a>(
    what: &str,
    names: impl IntoIterator<Item = (&'a str, &'a Ident)>,
) -> BuildResult<()> {
    let mut seen: Vec<(&str, &Ident)> = Vec::new();
    for (name, id) in names {
        if let Some((first, _)) = seen.iter().find(|(_, other)| *other == id) {
            return Err(format!(
                "{what}: `{first}` and `{name}` both make the Rust identifier `{id}`"
            )
            .into());
        }
        seen.push((name, id));
    }
    Ok(())
}
