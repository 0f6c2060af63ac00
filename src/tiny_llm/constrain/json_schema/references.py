"""Engine — references within one schema document: `$id` resources, `$anchor` and
`$dynamicAnchor` names, and where `$ref` and `$dynamicRef` point.

    document = {"$defs": {"n": {"type": "null"}}, "$ref": "#/$defs/n"}
    resources = Resources(document)
    resources.target(Part(document, resources.root_base, "#"), "$ref").schema   # {"type": "null"}

Remote references are not fetched: a reference outside the document is a ValueError.

Tests: tests/test_constrain_grammar.py, tests/test_constrain_json_schema.py
"""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote, urldefrag, urljoin

from .keywords import only_ref
from .part import Part
from .vocabulary import SCHEMA_LISTS, SCHEMA_MAPS, SINGLE_SCHEMAS

DEFAULT_BASE = "https://schema.invalid/root.json"  # the base URI of a document without `$id`


class Resources:
    """The document's schemas by URI: its resources (`$id`), anchors (`$anchor`), dynamic
    anchors (`$dynamicAnchor`), and the base URI of every schema in it."""

    def __init__(self, document: Any):
        self._resources: dict[str, Any] = {}
        self._anchors: dict[str, Any] = {}
        self._dynamic: dict[str, Any] = {}
        self._base_of: dict[int, str] = {}
        self.root_base = DEFAULT_BASE
        if isinstance(document, dict) and isinstance(document.get("$id"), str):
            self.root_base = urldefrag(urljoin(DEFAULT_BASE, document["$id"]))[0]
        self._resources[DEFAULT_BASE] = document
        self._index(document, self.root_base)

    def _index(self, document: Any, base: str) -> None:
        """Record every schema's base URI, and the resources, anchors and dynamic anchors of
        the document (with a work list: documents may nest deeper than Python recurses)."""
        todo = [(document, base, True)]
        while todo:
            schema, base, top = todo.pop()
            if not isinstance(schema, dict):
                continue
            if isinstance(schema.get("$id"), str):
                if not top:
                    base = urldefrag(urljoin(base, schema["$id"]))[0]
                self._resources[base] = schema
            self._base_of[id(schema)] = base
            for key, table in (("$anchor", self._anchors), ("$dynamicAnchor", self._dynamic)):
                if isinstance(schema.get(key), str):
                    table[f"{base}#{schema[key]}"] = schema
                    self._anchors.setdefault(f"{base}#{schema[key]}", schema)
            for key, value in schema.items():
                if key in SCHEMA_MAPS and isinstance(value, dict):
                    todo += [(sub, base, False) for sub in value.values()]
                elif key in SINGLE_SCHEMAS:
                    todo.append((value, base, False))
                elif key in SCHEMA_LISTS and isinstance(value, list):
                    todo += [(sub, base, False) for sub in value]

    def base_of(self, schema: Any, default: str) -> str:
        """The base URI of a schema of the document (`default` for one made elsewhere)."""
        return self._base_of.get(id(schema), default)

    def target(self, part: Part, keyword: str) -> Part:
        """The part a `$ref` or `$dynamicRef` of `part` points to."""
        ref = part.schema[keyword]
        where = part.path
        if not isinstance(ref, str):
            raise ValueError(f"json schema: {keyword!r} at {where} must be a string")
        uri = urljoin(part.base, ref)
        resource, fragment = urldefrag(uri)
        if resource not in self._resources:
            raise ValueError(f"json schema: {keyword!r} at {where} is {ref!r}, which is outside this "
                             "document (remote references are not fetched)")
        if fragment.startswith("/") or not fragment:
            target: Any = self._resources[resource]
            for token in fragment[1:].split("/") if fragment else ():
                token = unquote(token).replace("~1", "/").replace("~0", "~")
                if isinstance(target, dict) and token in target:
                    target = target[token]
                elif isinstance(target, list) and token.isdigit() and int(token) < len(target):
                    target = target[int(token)]
                else:
                    raise ValueError(f"json schema: {keyword!r} at {where} ({ref!r}) does not resolve")
        elif f"{resource}#{fragment}" in self._anchors:
            target = self._anchors[f"{resource}#{fragment}"]
        else:
            raise ValueError(f"json schema: {keyword!r} at {where} ({ref!r}) names no anchor of the document")
        if keyword == "$dynamicRef" and isinstance(target, dict) and target.get("$dynamicAnchor") == fragment:
            for outer in part.scope:  # the outermost resource in scope with this dynamic anchor
                if f"{outer}#{fragment}" in self._dynamic:
                    target = self._dynamic[f"{outer}#{fragment}"]
                    break
        base = self._base_of.get(id(target), resource)
        scope = part.scope if base in part.scope else (*part.scope, base)
        label = ref if ref.startswith("#") else f"{where}/{keyword}"
        return Part(target, base, label, scope, part.annotating, part.owners | {id(part.schema)})

    def follow(self, part: Part) -> None:
        """ValueError if a chain of references from `part` comes back without a value."""
        start, seen = part.path, {id(part.schema)}
        while only_ref(part.schema):
            part = self.target(part, "$ref")
            if id(part.schema) in seen:
                raise ValueError(f"json schema: '$ref' at {start} leads back to itself without a value")
            seen.add(id(part.schema))
