//! `-o jsonpath=TEMPLATE`, as kubectl reads it: text with `{...}` fields,
//! each a JSONPath expression (`{.environments[*].name}`), a quoted literal
//! (`{"\n"}`), or `{range EXPR}...{end}` repeating what is between for each
//! result. A field's results are printed space-separated, strings as they
//! are and anything else as JSON. The expressions themselves are RFC 9535
//! JSONPath (a leading `$` is added when missing, as kubectl does),
//! evaluated by the `jsonpath-rust` crate; this file is only kubectl's
//! template around them.

use jsonpath_rust::JsonPath as _;
use serde_json::Value;

/// One piece of a template.
#[derive(Debug, Clone, PartialEq)]
enum Node {
    Text(String),
    Path(String),
    Range(String, Vec<Node>),
}

/// A parsed template.
#[derive(Debug, Clone, PartialEq)]
pub struct Template(Vec<Node>);

/// The longest template taken (it comes from a command line).
const MAX_TEMPLATE: usize = 4096;

impl Template {
    /// Parse kubectl's template syntax; the error says what is wrong.
    pub fn parse(text: &str) -> Result<Template, String> {
        if text.len() > MAX_TEMPLATE {
            return Err(format!("the template is longer than {MAX_TEMPLATE} bytes"));
        }
        let mut stack: Vec<(Option<String>, Vec<Node>)> = vec![(None, Vec::new())];
        let mut rest = text;
        while !rest.is_empty() {
            let Some(open) = rest.find('{') else {
                push_text(&mut stack, rest);
                break;
            };
            push_text(&mut stack, &rest[..open]);
            let after = &rest[open + 1..];
            let close = field_end(after)
                .ok_or_else(|| format!("unclosed {{ in the template at {:?}", &rest[open..]))?;
            let field = after[..close].trim();
            rest = &after[close + 1..];
            if let Some(expr) = field.strip_prefix("range ") {
                check(expr.trim())?;
                stack.push((Some(expr.trim().to_owned()), Vec::new()));
            } else if field == "end" {
                let open_range = if stack.len() > 1 { stack.pop() } else { None };
                let Some((Some(expr), nodes)) = open_range else {
                    return Err("{end} without a {range ...} before it".to_owned());
                };
                top(&mut stack).push(Node::Range(expr, nodes));
            } else if let Some(lit) = literal(field) {
                push_text(&mut stack, &lit?);
            } else {
                check(field)?;
                top(&mut stack).push(Node::Path(field.to_owned()));
            }
        }
        if stack.len() > 1 {
            return Err("{range ...} without its {end}".to_owned());
        }
        Ok(Template(stack.pop().map(|s| s.1).unwrap_or_default()))
    }

    /// The template applied to `doc`.
    pub fn render(&self, doc: &Value) -> Result<String, String> {
        let mut out = String::new();
        render(&self.0, doc, &mut out)?;
        Ok(out)
    }
}

fn top(stack: &mut [(Option<String>, Vec<Node>)]) -> &mut Vec<Node> {
    &mut stack.last_mut().expect("the template's root").1
}

fn push_text(stack: &mut [(Option<String>, Vec<Node>)], text: &str) {
    if !text.is_empty() {
        top(stack).push(Node::Text(text.to_owned()));
    }
}

/// Where the field starting after `{` ends (its `}`), skipping quoted text.
fn field_end(s: &str) -> Option<usize> {
    let mut quote: Option<char> = None;
    let mut escaped = false;
    for (i, c) in s.char_indices() {
        match (quote, c) {
            (Some(_), '\\') if !escaped => escaped = true,
            (Some(q), c) if c == q && !escaped => quote = None,
            (Some(_), _) => escaped = false,
            (None, '"' | '\'') => quote = Some(c),
            (None, '}') => return Some(i),
            _ => {}
        }
    }
    None
}

/// A quoted literal field (`"\n"`), unescaped.
fn literal(field: &str) -> Option<Result<String, String>> {
    let inner = field.strip_prefix('"')?.strip_suffix('"')?;
    Some(
        serde_json::from_str::<String>(&format!("\"{inner}\""))
            .map_err(|_| format!("{field} is not a quoted string")),
    )
}

/// kubectl's expression as RFC 9535 wants it.
fn rfc(expr: &str) -> String {
    if expr.starts_with('$') {
        expr.to_owned()
    } else if expr.starts_with('.') || expr.starts_with('[') {
        format!("${expr}")
    } else {
        format!("$.{expr}")
    }
}

fn check(expr: &str) -> Result<(), String> {
    Value::Null
        .query(&rfc(expr))
        .map(|_| ())
        .map_err(|e| format!("{{{expr}}} is not a JSONPath expression: {e}"))
}

fn render(nodes: &[Node], doc: &Value, out: &mut String) -> Result<(), String> {
    for n in nodes {
        match n {
            Node::Text(t) => out.push_str(t),
            Node::Path(p) => {
                let found = doc.query(&rfc(p)).map_err(|e| format!("{{{p}}}: {e}"))?;
                let shown: Vec<String> = found.into_iter().map(show).collect();
                out.push_str(&shown.join(" "));
            }
            Node::Range(p, inner) => {
                let found = doc
                    .query(&rfc(p))
                    .map_err(|e| format!("{{range {p}}}: {e}"))?;
                // A range over one array walks its items, as kubectl's does.
                let items: Vec<&Value> = match found.as_slice() {
                    [Value::Array(a)] => a.iter().collect(),
                    _ => found,
                };
                for item in items {
                    render(inner, item, out)?;
                }
            }
        }
    }
    Ok(())
}

fn show(v: &Value) -> String {
    match v {
        Value::String(s) => crate::terminal::escape(s).into_owned(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc() -> Value {
        serde_json::json!({
            "ok": true,
            "environments": [
                {"name": "test", "version": "1.13.2", "clusters": [{"name": "test-1", "report": {"state": "confirmed"}}]},
                {"name": "production", "version": "1.13.1", "clusters": [
                    {"name": "prod-eu-1", "report": {"state": "rolling"}},
                    {"name": "prod-us-1", "report": null}
                ]}
            ]
        })
    }

    fn run(t: &str) -> String {
        Template::parse(t).unwrap().render(&doc()).unwrap()
    }

    #[test]
    fn kubectls_templates_read_the_document() {
        assert_eq!(run("{.environments[*].name}"), "test production");
        assert_eq!(run("{.ok}"), "true");
        assert_eq!(
            run(r#"{range .environments[*]}{.name}={.version}{"\n"}{end}"#),
            "test=1.13.2\nproduction=1.13.1\n"
        );
        assert_eq!(
            run(r#"{.environments[?(@.name=="production")].clusters[*].report.state}"#),
            "rolling"
        );
        assert_eq!(run("{..clusters[*].name}"), "test-1 prod-eu-1 prod-us-1");
        assert_eq!(
            run("v: {$.environments[0].clusters[0].report}"),
            r#"v: {"state":"confirmed"}"#
        );
        assert_eq!(run("{.nothing}"), "");
    }

    #[test]
    fn a_bad_template_is_an_error_that_says_where() {
        for bad in ["{.a", "{range .a[*]}{.b}", "{end}", "{.a[?}"] {
            assert!(Template::parse(bad).is_err(), "{bad}");
        }
        let e = Template::parse("{.environments[}").unwrap_err();
        assert!(e.contains("not a JSONPath expression"), "{e}");
    }
}
