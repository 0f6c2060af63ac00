"""Texts sampled under a JSON schema's grammar validate: every keyword, through the sampler.

A byte-level vocabulary (one token per byte, plus the end of sequence) and seeded random
logits drive the real `Sampler` with the compiled grammar; each finished text must parse and
validate. The logits favour the end of sequence and closing characters, so texts end within
the step budget. JSON Schema's `multipleOf` is decimal arithmetic; the reference validator
divides binary floats, so the check below uses exact fractions for it.
"""

import json
from fractions import Fraction

import jsonschema
import mlx.core as mx
import numpy as np
import pytest

from tiny_llm.constrain import Grammar, TokenTable
from tiny_llm.sampler import Sampler, SamplingParams

EOS = 256
TOKENS = [bytes([b]) for b in range(256)] + [b"<eos>"]
TABLE = TokenTable(TOKENS, eos_token_ids=[EOS])
FAVOURED = {EOS: 5.0, ord('"'): 2.0, ord("}"): 2.5, ord("]"): 2.5, ord(","): -1.0, ord(" "): -3.0,
            ord("\n"): -4.0, ord("\\"): -2.0}


def _exact_multiple_of(validator, step, instance, schema):
    if validator.is_type(instance, "number"):
        quotient = Fraction(repr(instance)) / Fraction(repr(step))
        if quotient.denominator != 1:
            yield jsonschema.ValidationError(f"{instance!r} is not a multiple of {step!r}")


ExactValidator = jsonschema.validators.extend(jsonschema.Draft202012Validator,
                                              {"multipleOf": _exact_multiple_of})

SCHEMAS = {
    "number-range": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1},
    "integer-multiple": {"type": "integer", "multipleOf": 7, "minimum": -100, "maximum": 100},
    "decimal-multiple": {"type": "number", "multipleOf": 0.25, "minimum": -10, "maximum": 10},
    "property-counts": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "boolean"},
                                                         "c": {"type": "null"}},
                        "minProperties": 2, "maxProperties": 2},
    "pattern-properties": {"type": "object", "patternProperties": {"^s_[a-z]$": {"type": "string", "maxLength": 3},
                                                                   "^n_[a-z]$": {"type": "integer"}},
                           "additionalProperties": False, "maxProperties": 3},
    "property-names": {"type": "object", "propertyNames": {"pattern": "^[a-c]{1,2}$"},
                       "additionalProperties": {"type": "integer", "minimum": 0, "maximum": 9}, "maxProperties": 3},
    "dependent-required": {"type": "object", "properties": {"card": {"type": "integer"}, "billing": {"const": "x"}},
                           "dependentRequired": {"card": ["billing"]}},
    "dependent-schemas": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {}},
                          "dependentSchemas": {"a": {"properties": {"b": {"type": "string", "maxLength": 2}},
                                                     "required": ["b"]}}},
    "contains": {"type": "array", "items": {"enum": [1, 2, "x", None]}, "contains": {"type": "integer"},
                 "minContains": 1, "maxContains": 2, "maxItems": 4},
    "all-of": {"allOf": [{"type": "object", "properties": {"n": {"type": "number", "minimum": 1}}, "required": ["n"]},
                         {"properties": {"n": {"maximum": 2}, "s": {"type": "string", "maxLength": 2}}}]},
    "not": {"type": "array", "items": {"not": {"type": ["string", "object", "array", "number"]}}, "maxItems": 3},
    "not-enum": {"type": "string", "not": {"enum": ["", "a"]}, "maxLength": 2, "pattern": "^[ab]*$"},
    "if-then-else": {"type": "object", "properties": {"kind": {"enum": ["n", "s"]}, "v": True},
                     "required": ["kind", "v"],
                     "if": {"properties": {"kind": {"const": "n"}}},
                     "then": {"properties": {"v": {"type": "integer", "minimum": 0, "maximum": 9}}},
                     "else": {"properties": {"v": {"type": "string", "maxLength": 2}}}},
    "one-of-tagged": {"oneOf": [
        {"type": "object", "properties": {"t": {"const": "a"}, "x": {"type": "integer", "minimum": 0, "maximum": 9}},
         "required": ["t", "x"], "additionalProperties": False},
        {"type": "object", "properties": {"t": {"const": "b"}, "y": {"type": "boolean"}},
         "required": ["t", "y"], "additionalProperties": False}]},
    "unevaluated": {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 9}},
                    "anyOf": [{"properties": {"b": {"type": "boolean"}}, "required": ["b"]}, {"required": ["a"]}],
                    "unevaluatedProperties": False},
    "unevaluated-items": {"type": "array", "prefixItems": [{"type": "boolean"}], "contains": {"type": "null"},
                          "unevaluatedItems": False, "maxItems": 3},
    "unique-items": {"type": "array", "items": {"enum": ["a", "b", 1, True]}, "uniqueItems": True},
    "anchor-and-id": {"$id": "https://example.com/root.json", "type": "object",
                      "properties": {"p": {"$ref": "point.json"}, "q": {"$ref": "#small"}}, "required": ["p", "q"],
                      "$defs": {"point": {"$id": "point.json", "type": "array", "prefixItems": [
                          {"type": "integer", "minimum": 0, "maximum": 9}], "items": False, "minItems": 1},
                                "small": {"$anchor": "small", "type": "integer", "minimum": 0, "maximum": 3}}},
    "dynamic-ref": {"$id": "https://example.com/strict-tree", "$dynamicAnchor": "node", "$ref": "tree",
                    "unevaluatedProperties": False,
                    "$defs": {"tree": {"$id": "tree", "$dynamicAnchor": "node", "type": "object",
                                       "properties": {"d": {"type": "integer", "minimum": 0, "maximum": 9},
                                                      "kids": {"type": "array", "maxItems": 2,
                                                               "items": {"$dynamicRef": "#node"}}}}}},
    "string-lengths": {"type": "string", "minLength": 2, "maxLength": 3},
    "formats": {"type": "array", "prefixItems": [{"type": "string", "format": "date"},
                                                 {"type": "string", "format": "ipv4"}], "minItems": 2,
                "maxItems": 2},
}


def sample(grammar: Grammar, seed: int, steps: int = 400) -> str | None:
    """One text drawn token by token; None if it did not end within `steps`."""
    sampler = Sampler(SamplingParams(temperature=1.0, seed=seed, grammar=grammar), TABLE)
    rng = np.random.default_rng(seed)
    bias = np.zeros(len(TOKENS), dtype=np.float32)
    for token, value in FAVOURED.items():
        bias[token] = value
    out = b""
    for _ in range(steps):
        logits = mx.array((rng.normal(0, 1, len(TOKENS)).astype(np.float32) + bias)[None])
        token = sampler.sample(logits).item()
        if token == EOS:
            return out.decode()
        out += TOKENS[token]
    return None


@pytest.mark.parametrize("name", SCHEMAS)
def test_sampled_texts_validate(name):
    schema = SCHEMAS[name]
    grammar = Grammar.from_json_schema(schema)
    validator = ExactValidator(schema)
    texts = [sample(grammar, seed) for seed in range(6)]
    finished = [t for t in texts if t is not None]
    assert len(finished) >= 4, texts
    for text in finished:
        assert grammar.accepts(text)
        assert validator.is_valid(json.loads(text)), text
