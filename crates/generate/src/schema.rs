//! JSON schemas made ready for constrained decoding: objects closed where clients expect
//! them ([`close_objects`]), `format`s the grammar compiler does not know dropped
//! ([`drop_unknown_formats`]) instead of refusing the schema, and a `oneOf` whose branches
//! are of different types taken as the `anyOf` it equals ([`exclusive_one_of`]). Each walks
//! only the places a JSON schema holds schemas, never data (`enum`, `const`, `default`,
//! `examples`).

use serde_json::{Map, Value};

/// The `format`s llguidance enforces; any other is an annotation (JSON Schema draft 2020-12
/// makes `format` an annotation unless a vocabulary asserts it) and is dropped.
pub const ENFORCED_FORMATS: [&str; 10] = [
    "date-time",
    "time",
    "date",
    "duration",
    "email",
    "hostname",
    "ipv4",
    "ipv6",
    "uuid",
    "uri",
];

/// Keywords whose value is a map of names to schemas.
const SCHEMA_MAPS: [&str; 5] = [
    "properties",
    "patternProperties",
    "$defs",
    "definitions",
    "dependentSchemas",
];

/// Keywords whose value is a schema.
const SCHEMA_ONE: [&str; 10] = [
    "additionalProperties",
    "not",
    "if",
    "then",
    "else",
    "contains",
    "propertyNames",
    "unevaluatedProperties",
    "unevaluatedItems",
    "additionalItems",
];

/// Keywords whose value is a list of schemas (`items` may be either).
const SCHEMA_LISTS: [&str; 5] = ["prefixItems", "anyOf", "oneOf", "allOf", "items"];

/// Calls `f` on every schema in `schema` (itself first), with whether it is a direct member
/// of an `allOf` (whose members combine, so each must stay open to the others' properties).
fn walk(schema: &mut Value, in_all_of: bool, f: &mut impl FnMut(&mut Map<String, Value>, bool)) {
    let Some(map) = schema.as_object_mut() else {
        return;
    };
    f(map, in_all_of);
    for key in SCHEMA_MAPS {
        if let Some(Value::Object(members)) = map.get_mut(key) {
            for member in members.values_mut() {
                walk(member, false, f);
            }
        }
    }
    for key in SCHEMA_ONE {
        if let Some(one) = map.get_mut(key) {
            walk(one, false, f);
        }
    }
    for key in SCHEMA_LISTS {
        match map.get_mut(key) {
            Some(Value::Array(list)) => {
                for member in list {
                    walk(member, key == "allOf", f);
                }
            }
            Some(one @ Value::Object(_)) => walk(one, false, f),
            _ => {}
        }
    }
}

/// `schema` with every object that declares `properties` and says nothing of
/// `additionalProperties` closed (`"additionalProperties": false`), as OpenAI's strict mode
/// requires of the schemas it takes: a model can then neither invent properties nor run on
/// in them. Objects without `properties` (free-form maps) and direct members of an `allOf`
/// stay open.
pub fn close_objects(schema: &Value) -> Value {
    let mut schema = schema.clone();
    walk(&mut schema, false, &mut |map, in_all_of| {
        let declared = map.get("properties").is_some_and(Value::is_object);
        if declared && !in_all_of && !map.contains_key("additionalProperties") {
            map.insert("additionalProperties".into(), Value::Bool(false));
        }
    });
    schema
}

/// `schema` without the `format`s llguidance does not enforce (see [`ENFORCED_FORMATS`]),
/// and the names of those dropped.
pub fn drop_unknown_formats(schema: &Value) -> (Value, Vec<String>) {
    let mut schema = schema.clone();
    let mut dropped = Vec::new();
    walk(&mut schema, false, &mut |map, _| {
        if let Some(Value::String(format)) = map.get("format")
            && !ENFORCED_FORMATS.contains(&format.as_str())
        {
            dropped.push(format.clone());
            map.remove("format");
        }
    });
    (schema, dropped)
}

/// Keywords that do not constrain a value.
const ANNOTATIONS: [&str; 5] = ["description", "title", "$comment", "examples", "default"];

/// A branch's types (`type` as a string or a list), and whether it says nothing else.
fn branch_types(branch: &Value) -> Option<(Vec<String>, bool)> {
    let map = branch.as_object()?;
    let types: Vec<String> = match map.get("type")? {
        Value::String(t) => vec![t.clone()],
        Value::Array(ts) => ts
            .iter()
            .map(|t| t.as_str().map(str::to_string))
            .collect::<Option<_>>()?,
        _ => return None,
    };
    let only_type = (map.keys()).all(|k| k == "type" || ANNOTATIONS.contains(&k.as_str()));
    Some((types, only_type))
}

/// `schema` with every `oneOf` that can be written exactly as an `anyOf`, so written: where
/// the branches are told apart by their types alone. A type two branches share (Kubernetes'
/// quantity is `oneOf: [{type: [string, null]}, {type: [number, null]}]`) matches both, so
/// no value of it is valid: it is dropped from branches that say nothing but their types;
/// a branch with other keywords must share no type. An integer is a number, so a branch of
/// integers beside one of numbers keeps the `oneOf` (left to be refused), as does any
/// branch without a `type`. Returns how many were rewritten.
pub fn exclusive_one_of(schema: &mut Value) -> usize {
    let mut rewritten = 0;
    walk(schema, false, &mut |map, _| {
        let Some(Value::Array(branches)) = map.get("oneOf") else {
            return;
        };
        if map.contains_key("anyOf") {
            return;
        }
        let Some(typed) = branches
            .iter()
            .map(branch_types)
            .collect::<Option<Vec<_>>>()
        else {
            return;
        };
        let count = |t: &str| {
            typed
                .iter()
                .filter(|(ts, _)| ts.iter().any(|u| u == t))
                .count()
        };
        let all: Vec<&String> = typed.iter().flat_map(|(ts, _)| ts).collect();
        let has = |t: &str| all.iter().any(|u| *u == t);
        if has("integer") && has("number") {
            return;
        }
        let mut any_of = Vec::with_capacity(branches.len());
        for (branch, (types, only_type)) in branches.iter().zip(&typed) {
            let own: Vec<&String> = types.iter().filter(|t| count(t) == 1).collect();
            if own.len() < types.len() && !only_type {
                return;
            }
            if own.is_empty() {
                continue;
            }
            let mut branch = branch.clone();
            if own.len() < types.len() {
                branch["type"] =
                    Value::Array(own.into_iter().map(|t| Value::String(t.clone())).collect());
            }
            any_of.push(branch);
        }
        if any_of.is_empty() {
            return;
        }
        map.remove("oneOf");
        map.insert("anyOf".into(), Value::Array(any_of));
        rewritten += 1;
    });
    rewritten
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn objects_close_where_they_declare_properties_and_data_is_left_alone() {
        let schema = json!({
            "type": "object",
            "properties": {
                "a": {"type": "object", "properties": {"b": {"type": "string", "format": "color"}}},
                "free": {"type": "object"},
                "open": {"type": "object", "properties": {}, "additionalProperties": true},
                "list": {"type": "array", "items": {"properties": {"c": {}}}},
                "format": {"type": "string", "format": "date", "default": {"format": "x"}},
            },
            "allOf": [{"properties": {"d": {}}}],
            "$defs": {"e": {"anyOf": [{"properties": {"f": {}}}]}},
            "enum": [{"properties": {"x": 1}, "format": "y"}],
        });
        let closed = close_objects(&schema);
        assert_eq!(closed["additionalProperties"], false);
        assert_eq!(closed["properties"]["a"]["additionalProperties"], false);
        assert!(
            closed["properties"]["free"]
                .get("additionalProperties")
                .is_none()
        );
        assert_eq!(closed["properties"]["open"]["additionalProperties"], true);
        assert_eq!(
            closed["properties"]["list"]["items"]["additionalProperties"],
            false
        );
        assert!(closed["allOf"][0].get("additionalProperties").is_none());
        assert_eq!(
            closed["$defs"]["e"]["anyOf"][0]["additionalProperties"],
            false
        );
        assert_eq!(closed["enum"], schema["enum"], "data stays as it is");

        let (plain, dropped) = drop_unknown_formats(&schema);
        assert_eq!(dropped, ["color"]);
        assert!(
            plain["properties"]["a"]["properties"]["b"]
                .get("format")
                .is_none()
        );
        assert_eq!(plain["properties"]["format"]["format"], "date");
        assert_eq!(
            plain["properties"]["format"]["default"],
            json!({"format": "x"})
        );
        assert_eq!(plain["enum"], schema["enum"]);
    }

    #[test]
    fn a_one_of_of_distinct_types_is_an_any_of() {
        let mut schema = json!({"properties": {
            "port": {"oneOf": [{"type": "string"}, {"type": "integer"}]},
            "n": {"oneOf": [{"type": "number"}, {"type": "integer"}]},
            "s": {"oneOf": [{"type": "string", "maxLength": 2}, {"type": "string"}]},
            "free": {"oneOf": [{"type": "string"}, {"minimum": 1}]},
            "quantity": {"oneOf": [{"type": ["string", "null"]}, {"type": ["number", "null"]}]},
            "shared": {"oneOf": [{"type": ["string", "null"], "maxLength": 3}, {"type": "null"}]},
        }});
        assert_eq!(exclusive_one_of(&mut schema), 2);
        let p = &schema["properties"];
        assert!(p["port"].get("anyOf").is_some() && p["port"].get("oneOf").is_none());
        assert_eq!(
            p["quantity"]["anyOf"],
            json!([{"type": ["string"]}, {"type": ["number"]}]),
            "null matches both branches: no value of it is valid"
        );
        for kept in ["n", "s", "free", "shared"] {
            assert!(p[kept].get("oneOf").is_some(), "{kept}");
        }
    }
}
