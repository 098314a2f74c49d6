//! The reference of every field of a profile and a kube profile (`docs/reference.md`), generated
//! from the types: their JSON Schema (`schemars`, which honours the serde attributes: renames,
//! defaults, `deny_unknown_fields`) gives each field's type, its doc comment and its default —
//! the value `Default` or the serde default function gives, serialized as a profile writes it.
//! Nothing in the tables is typed by hand. `shakedown profiles --reference` prints it; a test
//! fails when the committed file differs.

use std::fmt::Write as _;

use schemars::JsonSchema;
use serde_json::{Map, Value};
use shakedown_faults::{EtcdFlag, OpKind, Profile, WorkloadKind};
use shakedown_invariants::InvariantId;

use crate::profiles::BUILTIN;
use crate::targets::kube::profile::KubeProfile;

/// Where the reference is committed, relative to the workspace root.
pub const PATH: &str = "docs/reference.md";

/// The command that regenerates the committed reference.
pub const REGENERATE: &str = "cargo run -- profiles --reference > docs/reference.md";

/// The reference, as markdown.
pub fn render() -> String {
    let mut out = String::new();
    out.push_str("# Profile reference\n\n");
    let _ = writeln!(
        out,
        "<!-- Generated from the types by `shakedown profiles --reference` (src/reference.rs); do not edit. Regenerate: `{REGENERATE}`. -->\n"
    );
    out.push_str(
        "Every field of a profile (`--profile FILE`), a kube profile (`--kube-profile FILE`) and an app profile (`--app-profile FILE`), \
         generated from the Rust types they are read into, so it is what shakedown accepts: unknown \
         fields are an error, a field left out takes the default shown (the type's own default, \
         written as in a profile). Durations are strings the `humantime` way: `\"500ms\"`, \
         `\"10s\"`, `\"2m\"`, `\"1h30m\"`.\n\n",
    );

    out.push_str("## Profile (`--profile`)\n\n");
    out.push_str("The shipped profiles are in `ci/profiles/` (listed at the end); a file of your own is given by path.\n\n");
    document(&mut out, &schema::<Profile>());

    out.push_str("## Kube profile (`--kube-profile`)\n\n");
    document(&mut out, &schema::<KubeProfile>());

    out.push_str("## App profile (`--app-profile`)\n\n");
    out.push_str("The application under test of `--target app` (with a profile of `stack = \"app\"`).\n\n");
    document(&mut out, &schema::<crate::targets::app::spec::AppProfile>());

    out.push_str("## Names\n\n");
    names(&mut out, "Op kinds", "The keys of `weights` and `hooks`, the entries of `ops`.", &schema::<OpKind>());
    names(&mut out, "Workload kinds", "The values of `workload.kind`.", &schema::<WorkloadKind>());
    names(
        &mut out,
        "etcd flags",
        "The entries of `etcd.draw`: the flags a profile can have drawn per seed, each with the values it is drawn from.",
        &schema::<EtcdFlag>(),
    );
    names(&mut out, "Invariants", "The entries of `invariants`, in checking order.", &schema::<InvariantId>());

    out.push_str("### Shipped profiles\n\n| name | description | steps |\n|---|---|---|\n");
    for (name, text) in BUILTIN {
        let p = crate::profiles::parse(text).expect("the shipped profiles parse");
        let _ = writeln!(out, "| `{name}` | {} | {} |", cell(&p.description), p.steps);
    }
    out
}

fn schema<T: JsonSchema>() -> Value {
    schemars::schema_for!(T).to_value()
}

/// One section per TOML table: the top level, then every table below it, depth first.
fn document(out: &mut String, root: &Value) {
    let defs = root.get("$defs").and_then(Value::as_object).cloned().unwrap_or_default();
    let mut sections = vec![Section { header: None, path: String::new(), schema: root.clone(), form: None }];
    let mut i = 0;
    while i < sections.len() {
        let s = sections[i].clone();
        let schema = resolve(&defs, &s.schema);
        // A table of several forms (an untagged enum): one section per form, in its place.
        if let Some(forms) = forms(&defs, schema) {
            let each = forms.into_iter().map(|(form, schema)| Section { form: Some(form), schema, ..s.clone() });
            sections.splice(i..i + 1, each);
            continue;
        }
        match (&s.header, &s.form) {
            (None, _) => out.push_str("### Top level\n\n"),
            (Some(h), None) => {
                let _ = writeln!(out, "### `{h}`\n");
            }
            (Some(h), Some(form)) => {
                let _ = writeln!(out, "### `{h}`, as {form}\n");
            }
        }
        if let Some(d) = schema.get("description").and_then(Value::as_str) {
            let _ = writeln!(out, "{}\n", paragraphs(d));
        }
        out.push_str("| field | type | default | description |\n|---|---|---|---|\n");
        let required: Vec<&str> =
            schema.get("required").and_then(Value::as_array).map(|a| a.iter().filter_map(Value::as_str).collect()).unwrap_or_default();
        let mut below = Vec::new();
        for (name, prop) in schema.get("properties").and_then(Value::as_object).into_iter().flatten() {
            let path = format!("{}{name}", s.path);
            let (ty, nested) = type_of(&defs, prop, &path, &s.header, name);
            let default = if required.contains(&name.as_str()) {
                "**required**".to_string()
            } else {
                match prop.get("default") {
                    None | Some(Value::Null) => "absent".into(),
                    Some(v) if nested.as_ref().is_some_and(|n| !n.map) && v.is_object() => "each field's default".into(),
                    Some(v) => format!("`{}`", toml_value(v)),
                }
            };
            let description = prop.get("description").and_then(Value::as_str).map(cell).unwrap_or_default();
            let _ = writeln!(out, "| `{path}` | {ty} | {default} | {description} |");
            if let Some(n) = nested {
                below.push(Section { header: Some(n.header), path: n.path, schema: n.schema, form: None });
            }
        }
        out.push('\n');
        sections.splice(i + 1..i + 1, below);
        i += 1;
    }
}

#[derive(Clone)]
struct Section {
    /// The TOML header (`[timeouts]`, `[[probes]]`); `None` for the top level.
    header: Option<String>,
    /// The prefix of the field paths in it (`timeouts.`, `probes[].`).
    path: String,
    /// The table's type (its doc comment is the section's introduction).
    schema: Value,
    /// One of the table's forms (the form's description, first sentence lowercased), when it
    /// has several.
    form: Option<String>,
}

/// The forms of a table that is one of several (an untagged enum of tables): each form's name
/// (its description, without a trailing full stop) and its table. `None` for any other schema.
fn forms(defs: &Map<String, Value>, s: &Value) -> Option<Vec<(String, Value)>> {
    let any = s.get("anyOf").and_then(Value::as_array).filter(|a| a.len() > 1)?;
    any.iter()
        .map(|v| {
            let table = resolve(defs, v);
            let name = v.get("description").and_then(Value::as_str)?.trim_end_matches('.');
            let mut chars = name.chars();
            let name = chars.next().map(|c| c.to_lowercase().chain(chars).collect::<String>())?;
            is_table(table).then(|| (name, table.clone()))
        })
        .collect()
}

struct Nested {
    header: String,
    path: String,
    schema: Value,
    /// A table of tables by key (`[hooks.<op kind>]`), not one table.
    map: bool,
}

/// The schema a property stands for, without its `Option`.
fn prop_target(prop: &Value) -> &Value {
    if let Some(any) = prop.get("anyOf").and_then(Value::as_array) {
        if let Some(v) = any.iter().find(|v| v.get("type").and_then(Value::as_str) != Some("null")) {
            return v;
        }
    }
    prop
}

fn resolve<'a>(defs: &'a Map<String, Value>, s: &'a Value) -> &'a Value {
    match s.get("$ref").and_then(Value::as_str).and_then(|r| r.strip_prefix("#/$defs/")) {
        Some(name) => defs.get(name).unwrap_or(s),
        None => s,
    }
}

fn is_table(s: &Value) -> bool {
    s.get("properties").is_some() && s.get("type").and_then(Value::as_str) == Some("object")
}

/// The type column of a property, and the table it opens when it is one.
fn type_of(defs: &Map<String, Value>, prop: &Value, path: &str, header: &Option<String>, name: &str) -> (String, Option<Nested>) {
    let target = prop_target(prop);
    let s = resolve(defs, target);
    let sub_header = |h: &str| match header {
        None => h.to_string(),
        Some(p) => format!("{}.{h}", p.trim_start_matches('[').trim_end_matches(']')),
    };
    if is_table(s) {
        let h = format!("[{}]", sub_header(name));
        return (format!("table `{h}`"), Some(Nested { header: h, path: format!("{path}."), schema: s.clone(), map: false }));
    }
    if let Some(forms) = forms(defs, s) {
        let h = format!("[{}]", sub_header(name));
        return (
            format!("table `{h}`, one of {} forms", forms.len()),
            Some(Nested { header: h, path: format!("{path}."), schema: s.clone(), map: false }),
        );
    }
    match types(s).as_slice() {
        ["array"] => {
            let items = s.get("items").map(|i| resolve(defs, i)).cloned().unwrap_or(Value::Null);
            if is_table(&items) {
                let h = format!("[[{}]]", sub_header(name));
                return (
                    format!("array of tables `{h}`"),
                    Some(Nested { header: h, path: format!("{path}[]."), schema: items, map: false }),
                );
            }
            (format!("array of {}", scalar(&items)), None)
        }
        ["object"] => {
            let key = prop.get("x-key").and_then(Value::as_str).unwrap_or("key");
            let value = s
                .get("additionalProperties")
                .filter(|v| v.is_object())
                .or_else(|| s.get("patternProperties").and_then(Value::as_object).and_then(|p| p.values().next()))
                .map(|v| resolve(defs, v))
                .cloned()
                .unwrap_or(Value::Null);
            let quoted = if key.contains(' ') { format!("<{key}>") } else { format!("\"<{key}>\"") };
            if is_table(&value) {
                let h = format!("[{}.{quoted}]", sub_header(name));
                return (
                    format!("tables `{h}`, by {key}"),
                    Some(Nested { header: h, path: format!("{path}.<{key}>."), schema: value, map: true }),
                );
            }
            (format!("table: {key} → {}", scalar(&value)), None)
        }
        _ => (scalar(s), None),
    }
}

/// The JSON types of a schema, `null` left out (an `Option` is a field that may be absent).
fn types(s: &Value) -> Vec<&str> {
    match s.get("type") {
        Some(Value::String(t)) => vec![t.as_str()],
        Some(Value::Array(a)) => a.iter().filter_map(Value::as_str).filter(|t| *t != "null").collect(),
        _ => vec![],
    }
}

/// A scalar type's name: `string`, `integer`, `duration`, `version`, an enum's values.
fn scalar(s: &Value) -> String {
    if let Some(title) = s.get("title").and_then(Value::as_str) {
        return title.to_string();
    }
    if let Some(values) = enum_values(s) {
        if values.len() > 3 {
            // Long lists (op kinds) are listed under Names.
            return "op kind".into();
        }
        return values.iter().map(|(v, _)| format!("`\"{v}\"`")).collect::<Vec<_>>().join(" \\| ");
    }
    if s.get("format").and_then(Value::as_str) == Some("duration") {
        return "duration".into();
    }
    if s.get("pattern").is_some() && s.get("description").and_then(Value::as_str).is_some_and(|d| d.contains("version")) {
        return "version (`\"3.4\"`)".into();
    }
    match types(s).as_slice() {
        ["integer"] => integer_range(s),
        [t] => (*t).to_string(),
        _ => "any".into(),
    }
}

/// An integer with the bounds its profile check enforces (`#[schemars(range(…))]`); the
/// bounds of the Rust type alone (0, 255, u32::MAX) are no rule worth stating.
fn integer_range(s: &Value) -> String {
    let thousands = |n: u64| {
        let d = n.to_string();
        let mut out = String::new();
        for (i, c) in d.chars().enumerate() {
            if i > 0 && (d.len() - i).is_multiple_of(3) {
                out.push(',');
            }
            out.push(c);
        }
        out
    };
    match (s.get("minimum").and_then(Value::as_u64).unwrap_or(0), stated_max(s)) {
        (min, Some(max)) => format!("integer, {} to {}", thousands(min), thousands(max)),
        (min, None) => format!("integer ≥ {}", thousands(min)),
    }
}

/// An integer's maximum, unless it is only its Rust type's.
fn stated_max(s: &Value) -> Option<u64> {
    let type_max = |m: u64| [u64::from(u8::MAX), u64::from(u16::MAX), u64::from(u32::MAX), u64::MAX].contains(&m);
    s.get("maximum").and_then(Value::as_u64).filter(|m| !type_max(*m))
}

/// The values of a string enum with their descriptions (`enum`, or `oneOf` of `const`s when the
/// variants have doc comments).
fn enum_values(s: &Value) -> Option<Vec<(String, String)>> {
    if let Some(e) = s.get("enum").and_then(Value::as_array) {
        return Some(e.iter().filter_map(Value::as_str).map(|v| (v.to_string(), String::new())).collect());
    }
    let one_of = s.get("oneOf").and_then(Value::as_array)?;
    one_of
        .iter()
        .map(|v| {
            let d = v.get("description").and_then(Value::as_str).unwrap_or_default().to_string();
            match (v.get("const").and_then(Value::as_str), v.get("enum").and_then(Value::as_array)) {
                (Some(c), _) => Some(vec![(c.to_string(), d)]),
                (None, Some(e)) => Some(e.iter().filter_map(Value::as_str).map(|x| (x.to_string(), d.clone())).collect()),
                _ => None,
            }
        })
        .collect::<Option<Vec<_>>>()
        .map(|v| v.into_iter().flatten().collect())
}

fn names(out: &mut String, title: &str, intro: &str, schema: &Value) {
    let _ = writeln!(out, "### {title}\n\n{intro}\n\n| name | meaning |\n|---|---|");
    for (v, d) in enum_values(schema).expect("a string enum") {
        let _ = writeln!(out, "| `{v}` | {} |", cell(&d));
    }
    out.push('\n');
}

/// A default as a profile writes it.
fn toml_value(v: &Value) -> String {
    match v {
        Value::String(s) => format!("{s:?}"),
        Value::Array(a) => format!("[{}]", a.iter().map(toml_value).collect::<Vec<_>>().join(", ")),
        Value::Object(o) => format!("{{{}}}", o.iter().map(|(k, v)| format!("{k} = {}", toml_value(v))).collect::<Vec<_>>().join(", ")),
        other => other.to_string(),
    }
}

/// A doc comment in a table cell: one line, pipes escaped.
fn cell(d: &str) -> String {
    d.split_whitespace().collect::<Vec<_>>().join(" ").replace('|', "\\|")
}

/// A doc comment as markdown paragraphs (its line breaks are the source's wrapping).
fn paragraphs(d: &str) -> String {
    d.split("\n\n").map(|p| p.split_whitespace().collect::<Vec<_>>().join(" ")).collect::<Vec<_>>().join("\n\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn root() -> std::path::PathBuf {
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).to_path_buf()
    }

    /// `docs/reference.md` is what the generator makes from the types today. Set
    /// `SHAKEDOWN_UPDATE_REFERENCE=1` to rewrite it instead.
    #[test]
    fn reference_is_up_to_date() {
        let want = render();
        let path = root().join(PATH);
        if std::env::var_os("SHAKEDOWN_UPDATE_REFERENCE").is_some() {
            std::fs::write(&path, &want).unwrap();
        }
        let have = std::fs::read_to_string(&path).unwrap_or_default();
        if have != want {
            let line =
                have.lines().zip(want.lines()).position(|(a, b)| a != b).unwrap_or_else(|| have.lines().count().min(want.lines().count()));
            panic!(
                "{PATH} is not what the profile types generate (first difference at line {}). Regenerate it: `{REGENERATE}` (or `SHAKEDOWN_UPDATE_REFERENCE=1 cargo test --lib reference`), and commit it.",
                line + 1
            );
        }
    }

    /// Every bound the reference states for a profile's integer is the one loading enforces:
    /// one past it is refused, the bound itself is not refused for that field.
    #[test]
    fn documented_integer_bounds_are_the_enforced_ones() {
        let schema = schema::<Profile>();
        let defs = schema.get("$defs").and_then(Value::as_object).cloned().unwrap_or_default();
        let mut bounded = vec![];
        let mut tables = vec![(String::new(), schema.clone())];
        while let Some((prefix, table)) = tables.pop() {
            let Some(props) = resolve(&defs, &table).get("properties").and_then(Value::as_object) else { continue };
            for (name, prop) in props {
                let target = resolve(&defs, prop_target(prop));
                let path = format!("{prefix}{name}");
                if is_table(target) {
                    tables.push((format!("{path}."), target.clone()));
                } else if types(target).as_slice() == ["integer"] && integer_range(target) != "integer ≥ 0" {
                    bounded.push((path, target.get("minimum").and_then(Value::as_u64), stated_max(target)));
                }
            }
        }
        let names: Vec<&str> = bounded.iter().map(|(p, ..)| p.as_str()).collect();
        for want in ["steps", "sites", "members", "max_down", "workload.clients", "workload.watches", "api.objects"] {
            assert!(names.contains(&want), "{want} has documented bounds: {names:?}");
        }
        // A profile where each field can sit at its bounds: nine members over one site.
        let base: toml::Table = toml::from_str(
            "name = \"b\"\nsteps = 5\nversions = [\"3.4\"]\nmembers = 9\nsites = 1\nmax_down = 1\n[workload]\nkind = \"kube\"\n[api]\n",
        )
        .unwrap();
        let with = |path: &str, v: i64| {
            let mut t = base.clone();
            let mut at = &mut t;
            let mut parts: Vec<&str> = path.split('.').collect();
            let last = parts.pop().unwrap();
            for p in parts {
                at = at.entry(p).or_insert_with(|| toml::Value::Table(Default::default())).as_table_mut().unwrap();
            }
            at.insert(last.into(), toml::Value::Integer(v));
            Profile::from_toml(&toml::to_string(&t).unwrap())
        };
        for (path, min, max) in &bounded {
            let field = path.rsplit('.').next().unwrap();
            let min = min.unwrap_or(0) as i64;
            let names_it = |r: Result<Profile, shakedown_faults::ProfileError>| matches!(r, Err(e) if e.to_string().contains(field));
            if min > 0 {
                assert!(names_it(with(path, min - 1)), "{path} = {} is refused, naming the field", min - 1);
                assert!(!names_it(with(path, min)), "{path} = {min} is allowed");
            }
            if let Some(max) = *max {
                let max = max as i64;
                assert!(names_it(with(path, max + 1)), "{path} = {} is refused, naming the field", max + 1);
                assert!(!names_it(with(path, max)), "{path} = {max} is allowed");
            }
        }
    }

    /// Every field of both profiles, and every name listed, has a description and a type.
    #[test]
    fn reference_documents_every_field() {
        let text = render();
        let rows: Vec<&str> = text.lines().filter(|l| l.starts_with("| `")).collect();
        assert!(rows.len() > 50, "{rows:?}");
        for row in rows {
            let cells: Vec<&str> = row.trim_matches('|').split(" | ").collect();
            assert!(cells.iter().all(|c| !c.trim().is_empty()), "a field without a type, default or description: {row}");
        }
        for field in [
            "`timeouts.converge` | duration | `\"10s\"`",
            "`workload.clients` | integer, 1 to 256 | `4`",
            "`workload.watches` | integer, 0 to 16 | `3`",
            "`sites` | integer ≥ 1 | `3`",
            "`members` | integer, 1 to 9 | `3`",
            "`max_down` | integer ≥ 1 | absent",
            "`workload.mix.create` | integer ≥ 0 | `20`",
            "`velero.ttl` | duration | `\"1day\"`",
            "`hooks.<op kind>.timeout` | duration | `\"2m\"`",
            "`steps` | integer, 1 to 100,000 | **required**",
        ] {
            assert!(text.contains(field), "{field} in\n{text}");
        }
    }
}
