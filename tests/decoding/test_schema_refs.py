"""Local `$ref`s and boolean subschemas made plain for llama.cpp's schema converter
(fast: no model)."""

import pytest

from localspec.decoding.schema_refs import SchemaRefError, flat_refs, plain_subschemas, rebased

TREE = {  # pydantic's schema of a recursive model
    "$defs": {
        "Tree": {
            "type": "object",
            "properties": {"kids": {"type": "array", "items": {"$ref": "#/$defs/Tree"}}},
        }
    },
    "$ref": "#/$defs/Tree",
}


def test_a_recursive_model_at_the_root_is_inlined_and_refers_to_its_definition():
    flat = flat_refs(TREE)
    assert flat["type"] == "object" and "$ref" not in flat
    assert flat["properties"]["kids"]["items"] == {"$ref": "#/$defs/Tree"}
    assert flat["$defs"]["Tree"]["properties"]["kids"]["items"] == {"$ref": "#/$defs/Tree"}


def test_two_definitions_of_one_name_keep_names_of_their_own():
    both = {
        "oneOf": [
            {"properties": {"a": {"$ref": "#/oneOf/0/$defs/Addr"}}, "$defs": {"Addr": {"x": 1}}},
            {"properties": {"b": {"$ref": "#/oneOf/1/$defs/Addr"}}, "$defs": {"Addr": {"y": 2}}},
        ]
    }
    flat = flat_refs(both)
    assert flat["$defs"] == {"Addr": {"x": 1}, "Addr1": {"y": 2}}
    assert flat["oneOf"][1]["properties"]["b"] == {"$ref": "#/$defs/Addr1"}


def test_what_is_not_a_pointer_is_left_alone_and_a_dangling_one_is_named():
    plain = {"type": "object", "properties": {"a": {"type": "string"}}}
    assert flat_refs(plain) is plain
    anchored = {"properties": {"a": {"$ref": "#node"}}}
    assert flat_refs(anchored) is anchored  # the converter says what it cannot take
    with pytest.raises(SchemaRefError, match="'#/definitions/X' points nowhere"):
        flat_refs({"properties": {"a": {"$ref": "#/definitions/X"}}})


def test_a_schema_moved_under_another_root_takes_its_pointers_along():
    moved = rebased(TREE, "#/$defs/tool-0-parameters")
    assert moved["$ref"] == "#/$defs/tool-0-parameters/$defs/Tree"
    kids = moved["$defs"]["Tree"]["properties"]["kids"]
    assert kids["items"] == {"$ref": "#/$defs/tool-0-parameters/$defs/Tree"}
    assert rebased({"$ref": "#"}, "#/x") == {"$ref": "#/x"}


@pytest.mark.parametrize(
    ("schema", "says"),
    [
        ({"$ref": "#"}, "'#' refers only to itself"),
        ({"$ref": "#/$defs/A", "$defs": {"A": {"$ref": "#"}}}, "refers only to itself"),
        ({"$ref": "#/x", "x": [1]}, "not a schema"),
    ],
)
def test_a_root_that_never_reaches_a_schema_is_named_not_looped_on(schema, says):
    with pytest.raises(SchemaRefError, match=says):
        flat_refs(schema)


def test_a_definition_never_takes_the_name_of_one_of_the_converters_rules():
    """A definition named `string` would be read as the converter's string rule."""
    schema = {"$defs": {"string": {"type": "integer"}}, "items": {"$ref": "#/$defs/string"}}
    flat = flat_refs(schema, reserved=frozenset({"string", "root"}))
    assert flat["items"] == {"$ref": "#/$defs/string1"} and "string" not in flat["$defs"]


def test_boolean_subschemas_and_an_empty_items_become_what_the_converter_reads():
    schema = {
        "type": "object",
        "properties": {
            "any": True,
            "never": False,
            "list": {"type": "array", "items": True},
            "tags": {"type": "array", "items": {}},  # pydantic's list[Any]
            "pair": {"type": "array", "prefixItems": [True, {"type": "integer"}], "items": False},
            "map": {"type": "object", "additionalProperties": True},
        },
        "required": ["any", "list"],
    }
    plain = plain_subschemas(schema)
    props = plain["properties"]
    assert props["any"] == {} and "never" not in props
    assert props["list"] == props["tags"] == {"type": "array"}
    assert props["pair"] == {
        "type": "array",
        "prefixItems": [{}, {"type": "integer"}],
        "items": False,
    }
    assert props["map"] == schema["properties"]["map"]  # the converter reads this one
    assert plain_subschemas(True) == {} and plain_subschemas({"type": "string"}) == {
        "type": "string"
    }
    with pytest.raises(SchemaRefError, match=r"schema.properties.never is false but required"):
        plain_subschemas({**schema, "required": ["never"]})
    with pytest.raises(SchemaRefError, match=r"schema.anyOf\[1\] is false"):
        plain_subschemas({"anyOf": [{"type": "string"}, False]})
