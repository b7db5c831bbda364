"""Answer extraction: find the final answer in a model's text and read it as an exact number.

Owns the text-level rules shared by every rule-based reward: which part of a response is the
answer (`\\boxed{...}`, a GSM8K `#### 42` line, or the last number) and how a number is written
(`1,000`, `-3`, `0.5`, `1/2`, `\\frac{1}{2}`, `$5.`). Numbers become `fractions.Fraction`, so
`0.5` and `\\frac{1}{2}` compare equal exactly, without floating-point noise or a CAS. Deciding
what counts as a correct answer lives in `dagrl.rewards.scoring`.
"""

from __future__ import annotations

import re
from fractions import Fraction

# An unsigned decimal number; commas only as thousands separators ("1,000", not "1,2345").
_UNSIGNED = r"(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?|\.\d+"
# A minus sign right after a word character or a closing bracket is subtraction ("5-3"), not a sign.
_SIGN = r"(?:(?<![\w)\]}])-)?"
_LATEX_FRAC = rf"{_SIGN}\\[dt]?frac\{{\s*-?(?:{_UNSIGNED})\s*\}}\{{\s*-?(?:{_UNSIGNED})\s*\}}"
_LATEX_FRAC_SHORT = rf"{_SIGN}\\[dt]?frac\d\d"
_SLASH_FRAC = rf"{_SIGN}(?:{_UNSIGNED})\s*/\s*(?:{_UNSIGNED})"
_NUMBER_IN_TEXT = re.compile(
    rf"{_LATEX_FRAC}|{_LATEX_FRAC_SHORT}|{_SLASH_FRAC}|{_SIGN}(?:{_UNSIGNED})"
)

_PLAIN_NUMBER = re.compile(rf"[+-]?(?:{_UNSIGNED})")
_SCIENTIFIC = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)[eE][+-]?\d+")
_FULL_LATEX_FRAC = re.compile(r"(-?)\\[dt]?frac\{(.+)\}\{(.+)\}")
_FULL_LATEX_FRAC_SHORT = re.compile(r"(-?)\\[dt]?frac(\d)(\d)")
_FULL_SLASH_FRAC = re.compile(r"([^/]+)/([^/]+)")

# A written number past these bounds is no answer a task expects, and reading it exactly would
# cost what a policy's one short line must not: `Fraction("1e10000000")` builds a 10^7-digit
# integer (8 s; larger exponents far longer), and more than 4300 digits make int() raise.
# `parse_number` reads such text as no number at all (a response scores 0, a ground truth is
# refused as holding none).
MAX_NUMBER_DIGITS = 100  # digits of the mantissa, leading zeros included
MAX_EXPONENT = 1000  # |e| of `1e...`: 10^1000 is a 1001-digit integer, read in microseconds

# Decorations that never change a number's value: dollars, LaTeX spacing and sizing, units.
_DECORATIONS = (
    (re.compile(r"\\text\{[^{}]*\}|\\mbox\{[^{}]*\}"), ""),
    (re.compile(r"\^\{?\\circ\}?"), ""),
    (re.compile(r"\\left|\\right|\\!|\\;|\\\$|\$|%|\\%"), ""),
    (re.compile(r"\{,\}|\\,"), ","),
)


def extract_boxed(text: str) -> str | None:
    """Return the content of the last `\\boxed{...}` (nested braces allowed), or None."""
    start = text.rfind("\\boxed")
    if start < 0:
        return None
    rest = text[start + len("\\boxed") :]
    if not rest.startswith("{"):
        # `\boxed 5`: LaTeX takes the next token as the argument.
        token = rest.strip().split(maxsplit=1)
        return token[0].rstrip("$") if token and rest[:1].isspace() else None
    depth = 0
    for i, char in enumerate(rest):
        depth += {"{": 1, "}": -1}.get(char, 0)
        if depth == 0:
            return rest[1:i].strip()
    return None


def extract_gsm8k(text: str) -> str | None:
    """Return what follows the last `####` marker (GSM8K's answer line), or None."""
    marker = text.rfind("####")
    if marker < 0:
        return None
    answer = text[marker + len("####") :].strip().split("\n", maxsplit=1)[0].strip()
    return answer or None


def extract_last_number(text: str) -> str | None:
    """Return the last number written in `text` (as written: `1,000`, `\\frac{1}{2}`), or None."""
    matches = _NUMBER_IN_TEXT.findall(text)
    return matches[-1].strip() if matches else None


def extract_answer(text: str) -> str | None:
    """The final answer of a response: the last `\\boxed{}`, else a `####` line, else the last
    number. Returns the answer as written, or None when the text holds none of these."""
    for extract in (extract_boxed, extract_gsm8k):
        answer = extract(text)
        if answer is not None:
            return answer
    return extract_last_number(text)


def parse_number(text: str) -> Fraction | None:
    """Read one written number exactly; None when `text` is not a single number.

    Accepts `42`, `-3`, `1,000`, `0.5`, `.5`, `1e-3`, `1/2`, `\\frac{1}{2}`, `-\\dfrac12`,
    and ignores `$`, `%`, a trailing period, `\\text{...}` units and surrounding braces. A
    number of more than MAX_NUMBER_DIGITS digits or with an exponent beyond +-MAX_EXPONENT is
    None too: reading it would take seconds to hours.
    """
    cleaned = _strip_decorations(text)
    if _PLAIN_NUMBER.fullmatch(cleaned) or _SCIENTIFIC.fullmatch(cleaned):
        number = cleaned.replace(",", "")
        return Fraction(number) if _is_readable_size(number) else None
    frac = _FULL_LATEX_FRAC.fullmatch(cleaned) or _FULL_LATEX_FRAC_SHORT.fullmatch(cleaned)
    if frac:
        return _ratio(frac.group(2), frac.group(3), negate=frac.group(1) == "-")
    slash = _FULL_SLASH_FRAC.fullmatch(cleaned)
    if slash:
        return _ratio(slash.group(1), slash.group(2), negate=False)
    return None


def _is_readable_size(number: str) -> bool:
    """Whether the plain or scientific `number` is within MAX_NUMBER_DIGITS and MAX_EXPONENT."""
    mantissa, _, exponent = number.lower().partition("e")
    if sum(char.isdigit() for char in mantissa) > MAX_NUMBER_DIGITS:
        return False
    digits = exponent.lstrip("+-").lstrip("0")
    return len(digits) <= len(str(MAX_EXPONENT)) and int(digits or "0") <= MAX_EXPONENT


def _ratio(numerator: str, denominator: str, *, negate: bool) -> Fraction | None:
    top, bottom = parse_number(numerator), parse_number(denominator)
    if top is None or bottom is None or bottom == 0:
        return None
    return -top / bottom if negate else top / bottom


def _strip_decorations(text: str) -> str:
    cleaned = text.strip()
    for pattern, replacement in _DECORATIONS:
        cleaned = pattern.sub(replacement, cleaned)
    cleaned = cleaned.strip().rstrip(".").strip()
    while cleaned.startswith("{") and cleaned.endswith("}") and _is_one_group(cleaned):
        cleaned = cleaned[1:-1].strip()
    return cleaned


def _is_one_group(text: str) -> bool:
    """True when the opening brace at text[0] closes at the last character."""
    depth = 0
    for i, char in enumerate(text):
        depth += {"{": 1, "}": -1}.get(char, 0)
        if depth == 0:
            return i == len(text) - 1
    return False
