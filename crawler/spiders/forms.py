"""A form's fields as a browser submits them (``Page.form``): from a selectolax node, in document order."""

from __future__ import annotations

from collections.abc import Iterator

from selectolax.lexbor import LexborNode

#: Inputs that are buttons: never sent as fields (a submit button's name and value are sent apart).
_BUTTON_TYPES = frozenset({"submit", "image", "reset", "button", "file"})


def form_fields(form: LexborNode) -> Iterator[tuple[str, str]]:
    """The (name, value) pairs a browser submits for ``form``, in document order, with the first
    named submit button's pair; not disabled fields, nor those without a name."""
    clicked = False
    for node in form.css("input, select, textarea, button"):
        attrs = node.attributes
        name = attrs.get("name")
        if not name or "disabled" in attrs:
            continue
        kind = (attrs.get("type") or ("submit" if node.tag == "button" else "text")).lower()
        if node.tag == "select":
            yield from ((name, value) for value in _selected(node))
        elif node.tag == "textarea":
            yield name, node.text(deep=True, strip=False)
        elif kind in ("submit", "image") and (node.tag == "button" or node.tag == "input"):
            if not clicked:
                clicked = True
                yield name, attrs.get("value") or ""
        elif kind in ("checkbox", "radio"):
            if "checked" in attrs:
                yield name, attrs.get("value") or "on"
        elif kind not in _BUTTON_TYPES and node.tag == "input":
            yield name, attrs.get("value") or ""


def _selected(select: LexborNode) -> list[str]:
    """The values a select sends: its selected options, else (a single select) its first option."""
    options = select.css("option")
    chosen = [o for o in options if "selected" in o.attributes and "disabled" not in o.attributes]
    if not chosen and options and "multiple" not in select.attributes:
        chosen = options[:1]
    return [_option_value(option) for option in chosen]


def _option_value(option: LexborNode) -> str:
    value = option.attributes.get("value")
    return value if value is not None else str(option.text(strip=True))
