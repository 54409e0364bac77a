"""YAML documents validated in layers, with errors that point at a line.

Layer 1 is YAML itself (syntax, duplicate keys, which PyYAML would otherwise silently overwrite); layer 2 is
a pydantic schema that rejects unknown keys and wrong types; layer 3 (cross-references) belongs to the caller,
which can ask `Document.line_of()` for the line of any path.  Topology files use it now; scenario and
controller configuration files use the same machinery, so every file fabriclab reads fails the same way.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from topologies.errors import InputError

try:  # libyaml is ~10x faster on big generated files; fall back to pure Python where it is missing.
    _Loader: type[yaml.SafeLoader] = yaml.CSafeLoader  # type: ignore[assignment,unused-ignore]
except AttributeError:  # pragma: no cover - depends on how PyYAML was built
    _Loader = yaml.SafeLoader

PathItem = str | int
ModelT = TypeVar("ModelT", bound=BaseModel)


@dataclass(frozen=True)
class Document:
    """A parsed YAML document: plain data plus the node tree that remembers where everything was."""

    data: Any
    root: yaml.Node | None
    file: str

    def line_of(self, path: Sequence[PathItem]) -> int | None:
        """1-based line of the value at `path` (or of the deepest part of it that exists)."""
        node = self.root
        line = node.start_mark.line + 1 if node is not None else None
        for item in path:
            child = _child(node, item)
            if child is None:
                continue  # e.g. a pydantic union tag that is not in the file: keep looking deeper
            node, line = child, child.start_mark.line + 1
        return line

    def key_line(self, path: Sequence[PathItem]) -> int | None:
        """Line of the key of the last path item (where an unknown key was written)."""
        if not path:
            return self.line_of(path)
        parent = self.root
        for item in path[:-1]:
            parent = _child(parent, item) or parent
        if isinstance(parent, yaml.MappingNode):
            for key, _value in parent.value:
                if isinstance(key, yaml.ScalarNode) and key.value == str(path[-1]):
                    return int(key.start_mark.line) + 1
        return self.line_of(path)

    def error(self, path: Sequence[PathItem], message: str, *, key: bool = False) -> InputError:
        line = self.key_line(path) if key else self.line_of(path)
        return InputError(message, file=self.file, line=line, field=self.field_name(path) or None)

    def field_name(self, path: Sequence[PathItem]) -> str:
        """`nodes.leaf1.tier`, `links[3].endpoints[0]`: indexes only where the file has a list."""
        text = ""
        node = self.root
        for item in path:
            if isinstance(item, int) and not isinstance(node, yaml.MappingNode):
                text += f"[{item}]"
            else:
                text += ("." if text else "") + str(item)
            node = _child(node, item)
        return text


def _child(node: yaml.Node | None, item: PathItem) -> yaml.Node | None:
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            if isinstance(key, yaml.ScalarNode) and key.value == str(item):
                return value  # type: ignore[no-any-return]
    elif isinstance(node, yaml.SequenceNode) and isinstance(item, int) and 0 <= item < len(node.value):
        return node.value[item]  # type: ignore[no-any-return]
    return None


#: Deeper nesting than this is not a fabriclab file (they are a handful of levels deep); libyaml's composer
#: recurses in C and crashes the interpreter somewhere past 20,000 levels, so depth is checked on events.
MAX_DEPTH = 100
#: Aliases may add at most this many nodes (or twice the nodes written in the file, if more) to what the
#: file spells out: enough for `<<: *defaults` on every entry, not for a "billion laughs" file.
MAX_ALIAS_NODES = 100_000
#: A longer integer is a mistake (Python refuses to convert more than 4,300 decimal digits anyway).
MAX_INT_CHARS = 100
_INT_TAG = "tag:yaml.org,2002:int"


def _compose(text: str, file: str) -> yaml.Node | None:
    """The node tree of one YAML document, built from parser events without recursion.

    PyYAML's own composer (in C with libyaml) walks any nesting recursively, lets an alias refer to the node
    it is inside (a cyclic graph that makes every later walk endless) and shares aliased nodes without
    counting what they expand to.  This one refuses those with a located error, counts the size of every
    subtree as it closes, so an alias costs O(1) here and its expansion is known, and rejects duplicate keys
    (PyYAML keeps the last of two equal keys silently; a topology with two `leaf1:` entries must fail).
    Valid documents give the same tree, tags and marks as `yaml.compose`.
    """
    resolver: Any = _Loader("")
    root: yaml.Node | None = None
    documents = 0
    stack: list[_Open] = []  # collections opened and not yet closed, outermost first
    anchors: dict[str, yaml.Node] = {}
    sizes: dict[int, int] = {}  # id(anchored node) -> how many nodes it stands for, aliases expanded
    written = 0  # nodes spelt out in the file
    added = 0  # nodes that aliases add on top
    event: Any
    for event in yaml.parse(text, Loader=_Loader):
        start: Any = event.start_mark  # libyaml's marks (yaml._yaml.Mark) stand in for yaml.Mark
        end: Any = event.end_mark
        anchor: Any = getattr(event, "anchor", None)
        line = start.line + 1 if start is not None else None
        if isinstance(event, yaml.DocumentStartEvent):
            documents += 1
            if documents > 1:
                raise InputError(
                    "more than one YAML document (`---`): a fabriclab file holds one", file=file, line=line
                )
            continue
        if isinstance(event, yaml.AliasEvent):
            target = anchors.get(anchor)
            if target is None:
                raise InputError(f"undefined alias *{anchor}", file=file, line=line)
            if any(frame.node is target for frame in stack):
                raise InputError(f"recursive alias *{anchor} (it is inside &{anchor})", file=file, line=line)
            size = sizes[id(target)]
            added += size
            limit = max(MAX_ALIAS_NODES, 2 * written)
            if added > limit:
                raise InputError(
                    f"aliases expand to more than {limit:,} nodes (a 'billion laughs' file?); "
                    "write the values out instead",
                    file=file,
                    line=line,
                )
            _attach(stack, target, size, file)
            continue
        if isinstance(event, yaml.CollectionEndEvent):
            frame = stack.pop()
            frame.node.end_mark = end
            if frame.anchored:
                sizes[id(frame.node)] = frame.size
            if stack:
                _attach(stack, frame.node, frame.size, file)
            else:
                root = frame.node
            continue
        node: yaml.Node
        if isinstance(event, yaml.ScalarEvent):
            tag = event.tag
            if tag is None or tag == "!":
                tag = resolver.resolve(yaml.ScalarNode, event.value, event.implicit)
            if tag == _INT_TAG and len(event.value) > MAX_INT_CHARS:
                raise InputError(
                    f"an integer of {len(event.value):,} characters (at most {MAX_INT_CHARS})",
                    file=file,
                    line=line,
                )
            node = yaml.ScalarNode(tag, event.value, start, end, style=event.style)
        elif isinstance(event, yaml.SequenceStartEvent | yaml.MappingStartEvent):
            kind = yaml.SequenceNode if isinstance(event, yaml.SequenceStartEvent) else yaml.MappingNode
            tag = event.tag
            if tag is None or tag == "!":
                tag = resolver.resolve(kind, None, event.implicit)
            node = kind(tag, [], start, None, flow_style=event.flow_style)
        else:
            continue  # stream and document boundaries
        written += 1
        if anchor is not None:
            anchors[anchor] = node
        if isinstance(node, yaml.ScalarNode):
            if anchor is not None:
                sizes[id(node)] = 1
            if stack:
                _attach(stack, node, 1, file)
            else:
                root = node
            continue
        if len(stack) >= MAX_DEPTH:
            raise InputError(f"nested more than {MAX_DEPTH} levels deep", file=file, line=line)
        stack.append(_Open(node, anchored=anchor is not None))
    return root


@dataclass
class _Open:
    """A collection being composed: its node, how many nodes it stands for so far, and for a mapping the
    key waiting for its value and the keys seen (for duplicates)."""

    node: yaml.Node
    anchored: bool
    size: int = 1
    pending_key: yaml.Node | None = None
    keys: dict[str, int] | None = None


def _attach(stack: list[_Open], child: yaml.Node, size: int, file: str) -> None:
    frame = stack[-1]
    frame.size += size
    if isinstance(frame.node, yaml.SequenceNode):
        frame.node.value.append(child)
        return
    if frame.pending_key is None:
        frame.pending_key = child
        if isinstance(child, yaml.ScalarNode):
            keys = frame.keys if frame.keys is not None else {}
            frame.keys = keys
            line = child.start_mark.line + 1 if child.start_mark is not None else 0
            if child.value in keys:
                raise InputError(
                    f"duplicate key {child.value!r} (first at line {keys[child.value]})", file=file, line=line
                )
            keys[child.value] = line
        return
    frame.node.value.append((frame.pending_key, child))
    frame.pending_key = None


def load_document(text: str, file: str) -> Document:
    """Parse one YAML document; syntax errors, duplicate keys, recursive or runaway aliases and absurd
    nesting become `InputError`s with a line."""
    try:
        root = _compose(text, file)
        if root is None:
            raise InputError("the file is empty", file=file, line=1)
        constructor = _Loader("")
        data = constructor.construct_document(root)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else None
        problem = exc.problem or exc.context or "invalid YAML"
        if "maximum nesting depth" in problem:  # libyaml >= 0.2.5 stops at 1,000 levels while scanning ahead
            raise InputError(f"nested more than {MAX_DEPTH} levels deep", file=file, line=line) from None
        raise InputError(f"invalid YAML: {problem}", file=file, line=line) from None
    except yaml.reader.ReaderError as exc:  # a character YAML does not allow; say where, not YAML's words
        line = text.count("\n", 0, exc.position) + 1
        raise InputError(
            f"invalid YAML: character {chr(exc.character)!r} is not allowed (control characters are not)",
            file=file,
            line=line,
        ) from None
    except yaml.YAMLError as exc:
        raise InputError(f"invalid YAML: {exc}", file=file) from None
    except ValueError as exc:  # a scalar the constructor cannot convert; InputError is a ValueError too
        if isinstance(exc, InputError):
            raise
        raise InputError(f"invalid value: {exc}", file=file) from None
    return Document(data=data, root=root, file=file)


def validate(model: type[ModelT], document: Document, allowed_keys: AllowedKeys | None = None) -> ModelT:
    """Validate a document against a pydantic model; the first error becomes one located `InputError`."""
    try:
        return model.model_validate(document.data)
    except ValidationError as exc:
        raise error_from_validation(exc, document, allowed_keys) from None


class AllowedKeys:
    """Tells which keys a mapping at a path may have, to turn "extra inputs are not permitted" into
    "unknown key 'x' (allowed: a, b, c; did you mean 'b'?)"."""

    def for_path(self, path: Sequence[PathItem]) -> Sequence[str]:
        return ()


def error_from_validation(
    exc: ValidationError, document: Document, allowed_keys: AllowedKeys | None = None
) -> InputError:
    # Report the error that is highest in the file: that is the one a reader fixes first.  An unknown key
    # goes before a missing one: a misspelt key is both, and its name is the useful part.
    errors = sorted(
        exc.errors(),
        key=lambda e: (e["type"] != "extra_forbidden", document.line_of(_clean_loc(e["loc"], document)) or 0),
    )
    first = errors[0]
    loc = _clean_loc([item for item in first["loc"] if item != "[key]"], document)
    if first["type"] == "extra_forbidden":
        key = str(loc[-1]) if loc else "?"
        message = f"unknown key {key!r}"
        allowed = list(allowed_keys.for_path(loc[:-1])) if allowed_keys else []
        if allowed:
            close = difflib.get_close_matches(key, allowed, n=1)
            message += f" (allowed: {', '.join(allowed)}"
            message += f"; did you mean {close[0]!r}?)" if close else ")"
        return document.error(loc, message, key=True)
    message = str(first["msg"])
    if first["type"] == "missing":
        message = "required field is missing"
    elif first["type"] == "union_tag_invalid":
        ctx = first.get("ctx", {})
        loc = (*loc, ctx.get("discriminator", "kind").strip("'"))
        message = f"unknown value {ctx.get('tag')!r} (choose from {ctx.get('expected_tags')})"
        return document.error(loc, message)
    elif "input" in first and first["type"] not in ("value_error", "assertion_error"):
        message += f" (got {_short(first['input'])})"
    if message.startswith("Value error, "):
        message = message[len("Value error, ") :]
    return document.error(loc, message)


def _clean_loc(loc: Sequence[PathItem], document: Document) -> tuple[PathItem, ...]:
    """Drop the parts of a pydantic location that are not in the file (union tags, validator names)."""
    node = document.root
    cleaned: list[PathItem] = []
    for index, item in enumerate(loc):
        child = _child(node, item)
        if child is not None:
            cleaned.append(item)
            node = child
        elif index == len(loc) - 1:
            cleaned.append(item)  # the missing or unknown key itself
    return tuple(cleaned)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


__all__ = ["AllowedKeys", "Document", "error_from_validation", "load_document", "validate"]
