"""Final answers read out of model text, by the conventions graders use, strict and lenient.

    strict   the answer the text marks as final, in one of the conventions a task allows:
               "gsm8k"   #### 42            (GSM8K's reference solutions end this way)
               "answer"  Answer: 42         (also "The answer is: 42", "**Answer:** 42")
               "boxed"   \\boxed{42}         (MATH, DeepSeek-R1 style; nested braces allowed)
             the last marked answer in the text counts
    lenient  the last number anywhere in the text

Reporting both side by side separates "knows the answer" from "follows the format": a policy whose
lenient accuracy is far above its strict one has the arithmetic and lacks the format (what SFT or a
format reward fixes). Numbers compare by value, so "1,234", "1234.0", "$1,234" and "1234" are one
answer; anything else compares as text, lower-cased, with spaces collapsed and LaTeX \\text{} and $
signs removed.

Every reader is bounded, since the text is a policy's: a number is read only when it is written in
at most MAX_NUMBER_CHARS characters with an exponent within ±MAX_EXPONENT, checked before a Fraction
is built (Fraction("1e99999999") would compute 10**99999999 exactly and not return for minutes),
and every reader is linear in the text. A model's number beyond the bounds is no answer (None), so
it scores as wrong; a dataset's is refused (reference_answer), so no reference is ever one.
"""

import math
import re
from fractions import Fraction

CONVENTIONS = ("gsm8k", "answer", "boxed")
# 1000 digits hold any answer a task has (a double is 17, 2**1000 is 302); a number within both
# bounds has at most ~2000 digits, microseconds to build and compare
MAX_NUMBER_CHARS = 1000
MAX_EXPONENT = 1000
_NUMBER = r"[-−]?\$?\d[\d,]*(?:\.\d+)?"
# spaces, then optionally stars and spaces: the language of \s*\**\s*, but with one way to match a
# run of spaces (two \s* in a row try every split of it: 50,000 spaces took 19 s)
_GAP = r"\s*(?:\*+\s*)?"
_MARKED = {
    "gsm8k": re.compile(r"####\s*(" + _NUMBER + ")"),
    "answer": re.compile(r"\banswer(?:\s+is)?" + _GAP + "[:：]" + _GAP + "(" + _NUMBER + ")", re.I),
}
_NUMBER_ANYWHERE = re.compile(_NUMBER)
# every string Fraction() reads ("-1_000.5e-3", "3/4") matches this; most text fails it at once
_FRACTION_LIKE = re.compile(r"[-+]?[\d_.]+(?:[eE][-+]?[\d_]+|/[\d_]+)?")
_LATEX_FRACTION = re.compile(r"\\[dt]?frac\{(-?\d+)\}\{(\d+)\}")
_BOX = "\\boxed{"


class NumberTooLarge(ValueError):
    """A number written beyond MAX_NUMBER_CHARS characters or ±MAX_EXPONENT (module docstring)."""


def _number(number: str) -> Fraction | None:
    """`number` (commas and spaces removed) as an exact Fraction, None when it does not read as one;
    NumberTooLarge past the bounds, raised before anything is built from it."""
    fraction = _LATEX_FRACTION.fullmatch(number)
    if not fraction and not _FRACTION_LIKE.fullmatch(number):
        return None
    if len(number) > MAX_NUMBER_CHARS:
        raise NumberTooLarge(
            f"a number written in {len(number)} characters (at most {MAX_NUMBER_CHARS} are read)"
        )
    exponent = re.search(r"[eE][-+]?_*(\d+(?:_\d+)*)$", number)
    if exponent and int(exponent.group(1)) > MAX_EXPONENT:
        raise NumberTooLarge(
            f"a number with an exponent beyond ±{MAX_EXPONENT} ({number[:40]!r}), which is not read"
        )
    try:
        if fraction:
            return Fraction(int(fraction.group(1)), int(fraction.group(2)))
        return Fraction(number)
    except (ValueError, ZeroDivisionError):
        return None


def value(text: str) -> Fraction | str | None:
    """One answer as a comparable value: a number (exact, as a Fraction) when it reads as one, else
    normalized text; None when there is nothing. A number beyond the bounds (module docstring), or
    a float that is not finite, raises NumberTooLarge or ValueError."""
    if text is None:
        return None
    if isinstance(text, bool):
        raise TypeError("an answer cannot be a boolean")
    if isinstance(text, int):
        if abs(text) >= 10**MAX_NUMBER_CHARS:
            raise NumberTooLarge(f"an integer of more than {MAX_NUMBER_CHARS} digits")
        return Fraction(text)
    if isinstance(text, float):
        if not math.isfinite(text):
            raise ValueError(f"the answer {text} is not a finite number")
        return Fraction(repr(text))  # 0.1 as written, not the nearest double
    clean = (
        re.sub(r"\\text\{([^{}]*)\}", r"\1", str(text))
        .replace("\\$", "")
        .replace("$", "")
        .replace("−", "-")
    )
    clean = clean.replace("\\%", "").replace("%", "").strip().rstrip(".")
    number = _number(clean.replace(",", "").replace(" ", ""))
    if number is not None:
        return number
    return " ".join(clean.lower().split()) or None


def _read(text: str) -> Fraction | str | None:
    """value(text) of a model's answer: a number beyond the bounds is no answer (None)."""
    try:
        return value(text)
    except NumberTooLarge:
        return None


def _boxed(text: str) -> list[tuple[int, str]]:
    """(position, content) of every \\boxed{...}, braces balanced; a box inside a box is part of its
    content. Each brace is matched once, on a stack, so this is linear in the text (scanning ahead
    from each \\boxed{ for its closing brace took 17 s for 4,000 unclosed ones)."""
    closing, opened = {}, []
    for brace in re.finditer(r"[{}]", text):
        if brace.group() == "{":
            opened.append(brace.start())
        elif opened:
            closing[opened.pop()] = brace.start()
    found, outside = [], 0
    for box in re.finditer(re.escape(_BOX), text):
        end = closing.get(box.end() - 1)
        if end is not None and box.start() >= outside:
            found.append((box.start(), text[box.end() : end]))
            outside = end + 1
    return found


def strict_answer(text: str, conventions=CONVENTIONS) -> Fraction | str | None:
    """The last answer `text` marks as final in one of `conventions` (module docstring), as a value."""
    unknown = set(conventions) - set(CONVENTIONS)
    if unknown:
        raise ValueError(
            f"unknown answer convention(s) {sorted(unknown)}; choose from {', '.join(CONVENTIONS)}"
        )
    marked = [
        (m.start(), m.group(1))
        for name in conventions
        if name in _MARKED
        for m in _MARKED[name].finditer(text)
    ]
    # \boxed{72 \text{ apples}} and \boxed{x = 5} hold one number: that is the answer
    if "boxed" in conventions:
        marked += [
            (i, numbers[0] if len(numbers := _NUMBER_ANYWHERE.findall(content)) == 1 else content)
            for i, content in _boxed(text)
        ]
    return _read(max(marked)[1]) if marked else None


def lenient_answer(text: str) -> Fraction | None:
    """The last number anywhere in `text`, as a value."""
    found = _NUMBER_ANYWHERE.findall(text)
    return _read(found[-1].rstrip(",")) if found else None


def reference_answer(answer) -> Fraction | str:
    """A dataset's answer field as a value: a number, a GSM8K solution ending in "#### 42", or text."""
    if isinstance(answer, str) and "####" in answer:
        answer = answer.rsplit("####", 1)[1]
    try:
        result = value(answer)
    except NumberTooLarge as e:
        raise ValueError(f"the answer is {e}, so no reply could match it") from None
    if result is None:
        raise ValueError(f"empty answer {answer!r}")
    return result
