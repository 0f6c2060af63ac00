"""Pydantic v2 models of every ordinary kind: their `model_json_schema()` compiles, the canonical
text of each hand-built instance (`model_dump(mode="json")`) is accepted and reads back as the
same model, instances made invalid are rejected, and random texts the grammar accepts validate
as the model.

Times and date-times carry an offset: RFC 3339 (the `time` and `date-time` formats, which the
grammar enforces) requires one, and pydantic writes a naive value without it.
"""

import datetime as dt
import json
import random
from enum import Enum
from typing import Annotated, Literal, Optional
from uuid import UUID

import pytest
from jsonschema import Draft202012Validator
from pydantic import BaseModel, Field, StringConstraints, ValidationError, constr

from tiny_llm.constrain import Grammar

from test_json_schema_hypothesis import no_duplicate_keys, walk
from test_json_schema_keywords import canonical_text, is_valid

UTC = dt.timezone.utc
IST = dt.timezone(dt.timedelta(hours=5, minutes=30))


class Bounded(BaseModel):
    ratio: float = Field(gt=0, lt=1)
    count: int = Field(ge=0, le=100)
    step: int = Field(multiple_of=5, ge=-50, le=50)
    half: float = Field(multiple_of=0.5)
    kelvin: float = Field(ge=-273.15)
    big: int = Field(gt=-10**15, lt=10**15)


class Color(str, Enum):
    RED = "red"
    GREEN = "green"


class Level(int, Enum):
    LOW = 1
    HIGH = 2


class Choices(BaseModel):
    mode: Literal["fast", "slow"]
    color: Color
    level: Level
    version: Literal[1, 2]
    on: Literal[True]


class Maybe(BaseModel):
    note: Optional[str] = None
    size: int | None
    value: int | str
    amount: float | None = Field(default=None, ge=0)


class Cat(BaseModel):
    pet_type: Literal["cat"]
    meows: int


class Dog(BaseModel):
    pet_type: Literal["dog"]
    barks: float


class Lizard(BaseModel):
    pet_type: Literal["lizard", "gecko"]
    scales: bool = True


Pet = Annotated[Cat | Dog | Lizard, Field(discriminator="pet_type")]


class Owner(BaseModel):
    pet: Pet
    others: list[Pet] = []


class Containers(BaseModel):
    scores: dict[str, int]
    tags: list[str] = Field(min_length=1, max_length=3)
    matrix: list[list[float]]
    flags: set[Literal["a", "b", "c"]]
    pair: tuple[int, str]
    rest: tuple[int, ...]


class Address(BaseModel):
    street: str
    city: str = Field(min_length=1)


class Person(BaseModel):
    name: str
    address: Address
    previous: list[Address] = []
    manager: Optional["Person"] = None


class Node(BaseModel):
    value: int
    children: list["Node"] = []


Code = constr(pattern=r"^[A-Z]{3}-[0-9]{3}$")


class Strings(BaseModel):
    code: Code
    name: Annotated[str, StringConstraints(min_length=1, max_length=10)]
    slug: Annotated[str, StringConstraints(pattern=r"^[a-z0-9-]+$", max_length=20)]


class Formats(BaseModel):
    day: dt.date
    at: dt.datetime
    clock: dt.time
    id: UUID
    email: str = Field(json_schema_extra={"format": "email"})


PEOPLE = Person(name="Ada", address=Address(street="12 St James's Sq", city="London"),
                previous=[Address(street="", city="Köln")],
                manager=Person(name="Bob", address=Address(street="x", city="y")))

# (model, valid instances, invalid replacements of top-level fields of the first instance)
MODELS = [
    (Bounded, [
        Bounded(ratio=0.5, count=0, step=5, half=1.5, kelvin=-273.15, big=0),
        Bounded(ratio=0.001, count=100, step=-50, half=-2, kelvin=1e6, big=999999999999999),
        Bounded(ratio=0.999, count=7, step=0, half=0, kelvin=0.25, big=-999999999999999),
    ], [("ratio", 1), ("ratio", 0), ("count", 101), ("count", -1), ("step", 7), ("step", 55), ("half", 0.3),
        ("kelvin", -300), ("big", 10**15), ("count", 1.5)]),
    (Choices, [
        Choices(mode="fast", color=Color.RED, level=Level.LOW, version=1, on=True),
        Choices(mode="slow", color=Color.GREEN, level=Level.HIGH, version=2, on=True),
    ], [("mode", "medium"), ("color", "blue"), ("level", 3), ("version", 3), ("on", False), ("color", "RED")]),
    (Maybe, [
        Maybe(size=None, value=1),
        Maybe(note="n", size=3, value="v", amount=0),
        Maybe(note=None, size=-1, value="", amount=2.5),
    ], [("size", "3"), ("value", 1.5), ("value", None), ("amount", -1), ("note", 1)]),
    (Owner, [
        Owner(pet=Cat(pet_type="cat", meows=3)),
        Owner(pet=Dog(pet_type="dog", barks=1.5), others=[Lizard(pet_type="gecko"), Cat(pet_type="cat", meows=0)]),
        Owner(pet=Lizard(pet_type="lizard", scales=False)),
    ], [("pet", {"pet_type": "cat", "barks": 1.5}), ("pet", {"pet_type": "bird"}), ("pet", {"meows": 1}),
        ("others", [{"pet_type": "dog", "barks": "x"}])]),
    (Containers, [
        Containers(scores={}, tags=["a"], matrix=[], flags=set(), pair=(1, "x"), rest=()),
        Containers(scores={"ä": -1, "b": 2}, tags=["x", "", "😀"], matrix=[[1.5, -2], []], flags={"a", "c"},
                   pair=(-7, ""), rest=(1, 2, 3)),
    ], [("tags", []), ("tags", ["a", "b", "c", "d"]), ("flags", ["a", "a"]), ("flags", ["d"]), ("pair", [1]),
        ("pair", [1, "x", 2]), ("scores", {"a": "1"}), ("rest", [1.5]), ("matrix", [1])]),
    (Person, [PEOPLE, Person(name="", address=Address(street="s", city="c"))],
     [("address", {"street": "s"}), ("address", {"street": "s", "city": ""}), ("previous", [{"city": "x"}]),
      ("manager", {"name": "M"})]),
    (Node, [Node(value=1), Node(value=-5, children=[Node(value=2), Node(value=3, children=[Node(value=4)])])],
     [("value", "1"), ("children", [{"children": []}]), ("children", [{"value": 1.5}])]),
    (Strings, [Strings(code="ABC-123", name="x", slug="a-b-0"), Strings(code="ZZZ-000", name="é" * 10, slug="z")],
     [("code", "AB-123"), ("code", "abc-123"), ("name", ""), ("name", "x" * 11), ("slug", "A"), ("slug", "a" * 21)]),
    (Formats, [
        Formats(day=dt.date(2024, 2, 29), at=dt.datetime(2024, 2, 29, 12, 30, 5, tzinfo=UTC),
                clock=dt.time(23, 59, 59, tzinfo=UTC), id=UUID("123e4567-e89b-12d3-a456-426614174000"),
                email="ada@example.com"),
        Formats(day=dt.date(1999, 12, 31), at=dt.datetime(1999, 12, 31, 23, 59, 59, 123456, tzinfo=IST),
                clock=dt.time(0, 0, 0, 500000, tzinfo=IST), id=UUID(int=0), email="a.b+c@d.org"),
    ], [("id", 5), ("day", 20240229)]),
]
IDS = [model.__name__ for model, _, _ in MODELS]
WALKED = [entry for entry in MODELS if entry[0] is not Formats]  # pydantic checks a date's day; the grammar need not


def schema_of(model) -> dict:
    return model.model_json_schema()


@pytest.mark.parametrize("model, valid, invalid", MODELS, ids=IDS)
def test_model_schemas_compile_and_accept_their_instances(model, valid, invalid):
    schema = schema_of(model)
    Draft202012Validator.check_schema(schema)
    grammar = Grammar.from_json_schema(schema)
    for instance in valid:
        dump = instance.model_dump(mode="json")
        assert is_valid(schema, dump), dump
        text = canonical_text(dump, schema)
        assert grammar.accepts(text), text
        assert model.model_validate_json(text) == instance


@pytest.mark.parametrize("model, valid, invalid", MODELS, ids=IDS)
def test_invalid_instances_are_rejected(model, valid, invalid):
    schema = schema_of(model)
    grammar = Grammar.from_json_schema(schema)
    for field, value in invalid:
        dump = {**valid[0].model_dump(mode="json"), field: value}
        assert not is_valid(schema, dump), f"the case's data disagree with jsonschema on {dump!r}"
        text = canonical_text(dump, schema)
        assert not grammar.accepts(text), text


@pytest.mark.parametrize("model, valid, invalid", WALKED, ids=[m.__name__ for m, _, _ in WALKED])
def test_texts_the_grammar_accepts_validate_as_the_model(model, valid, invalid):
    schema = schema_of(model)
    grammar = Grammar.from_json_schema(schema)
    rnd = random.Random(31)
    texts = [t for t in (walk(grammar, rnd, limit=300) for _ in range(30)) if t is not None and no_duplicate_keys(t)]
    assert len(texts) >= 5, f"only {len(texts)} of 30 walks ended in a text"
    for text in texts:
        assert is_valid(schema, json.loads(text)), text
        try:
            model.model_validate_json(text)
        except ValidationError as e:
            pytest.fail(f"{text!r}: {e}")


def test_every_kind_is_in_the_schemas():
    """The models cover what they claim: bounds, multiples, enums, a discriminated union, maps,
    length-bounded lists, unique sets, tuples, recursion, patterns and formats."""
    text = json.dumps([schema_of(model) for model, _, _ in MODELS])
    for keyword in ('"exclusiveMinimum"', '"exclusiveMaximum"', '"minimum"', '"maximum"', '"multipleOf"', '"enum"',
                    '"const"', '"anyOf"', '"oneOf"', '"discriminator"', '"additionalProperties"', '"minItems"',
                    '"maxItems"', '"uniqueItems"', '"prefixItems"', '"$ref"', '"pattern"', '"minLength"',
                    '"maxLength"', '"date"', '"date-time"', '"time"', '"uuid"', '"email"'):
        assert keyword in text, keyword
    assert schema_of(Node)["$defs"]["Node"]["properties"]["children"]["items"] == {"$ref": "#/$defs/Node"}
