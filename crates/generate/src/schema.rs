//! JSON schemas made ready for constrained decoding: objects closed where clients expect
//! them ([`close_objects`]), and `format`s the grammar compiler does not know dropped
//! ([`drop_unknown_formats`]) instead of refusing the schema. Both walk only the places a
//! JSON schema holds schemas, never data (`enum`, `const`, `default`, `examples`).

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
}
