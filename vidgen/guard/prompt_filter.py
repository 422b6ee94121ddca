"""Prompt filter: blocklist rules matched on a normalised prompt, before any model loads.

A rule file holds lines `rule-name: pattern` (`#` starts a comment). A pattern is a term — one or
more words, matched as whole words — or `re:REGEX`, searched in the normalised text. Matches are
reported by rule name only: the terms never reach logs or error messages.

Normalisation defeats the usual tricks, in this order:
- Unicode: NFKC (full-width and styled letters), zero-width and control characters removed,
  accents stripped (NFKD, combining marks dropped), case folded;
- confusables: Cyrillic and Greek letters that look Latin (а, е, о, р, с, х, ο, ν, ...) mapped to
  them;
- leetspeak: 0→o, 1→i, 3→e, 4→a, 5→s, 7→t, 8→b, 9→g, @→a, $→s, !→i, +→t; the text is also tried
  with 1→l, and with every non-letter dropped inside words (`s*e*x`), since either reading can be
  meant;
- spacing and punctuation: anything that is not a letter or digit separates words; runs of 3+
  single letters join into one word (`n u d e`, `n.u.d.e`); in an extra reading a repeated letter
  counts once (`poorn`), so terms with double letters still match the plain one.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path

from ..errors import ConfigError

_CONFUSABLES = str.maketrans({
    # Cyrillic
    "а": "a", "в": "b", "е": "e", "ё": "e", "к": "k", "м": "m", "н": "h", "о": "o", "р": "p", "с": "c",
    "т": "t", "у": "y", "х": "x", "ѕ": "s", "і": "i", "ї": "i", "ј": "j", "ԁ": "d", "ԛ": "q", "ԝ": "w",
    "ү": "y", "һ": "h", "ӏ": "l",
    # Greek
    "α": "a", "β": "b", "ε": "e", "η": "n", "ι": "i", "κ": "k", "μ": "u", "ν": "v", "ο": "o", "ρ": "p",
    "τ": "t", "υ": "u", "χ": "x", "γ": "y", "ς": "s", "σ": "o",
    # Latin look-alikes outside ASCII that NFKD leaves alone
    "ı": "i", "ł": "l", "ø": "o", "đ": "d", "ß": "ss", "æ": "ae", "œ": "oe", "ɡ": "g", "ɑ": "a",
})
_LEET = str.maketrans({"0": "o", "1": "i", "3": "e", "4": "a", "5": "s", "7": "t", "8": "b", "9": "g",
                       "@": "a", "$": "s", "!": "i", "+": "t", "|": "l", "€": "e", "£": "l"})
_INVISIBLE = re.compile(r"[\u00ad\u034f\u061c\u115f\u1160\u17b4\u17b5\u180e\u200b-\u200f\u202a-\u202e"
                        r"\u2060-\u2064\u206a-\u206f\u3164\ufe00-\ufe0f\ufeff\uffa0]")
_SEPARATOR = re.compile(r"[^0-9a-z]+")
_REPEATS = re.compile(r"([a-z])\1+")
_SINGLE_LETTER_RUN = re.compile(r"\b(?:[a-z0-9] ){2,}[a-z0-9]\b")


def _unicode(text: str) -> str:
    text = unicodedata.normalize("NFKC", text)
    text = _INVISIBLE.sub("", text)
    text = "".join(c for c in unicodedata.normalize("NFKD", text) if not unicodedata.combining(c))
    return text.casefold().translate(_CONFUSABLES)


def _words(text: str) -> str:
    """Lower-case ASCII words separated by single spaces, with runs of single letters joined."""
    text = _SEPARATOR.sub(" ", text).strip()
    return _SINGLE_LETTER_RUN.sub(lambda m: m.group(0).replace(" ", ""), text)


def normalized_forms(text: str) -> list[str]:
    """The readings of `text` that rules are matched against (see the module docstring)."""
    base = _unicode(text)
    leet = base.translate(_LEET)
    forms = [_words(leet), _words(leet.replace("i", "l") if "1" in base else leet)]
    # symbols inside a word (s*e*x, s.e.x) dropped rather than read as separators
    forms.append(_words(re.sub(r"(?<=[a-z0-9])[^a-z0-9\s]+(?=[a-z0-9])", "", leet)))
    forms += [_REPEATS.sub(r"\1", f) for f in forms]     # poorn, pooorn (terms keep their own doubles)
    forms.append(_words(base))            # digits kept, for rules about numbers
    return list(dict.fromkeys(f for f in forms if f))


@dataclass(frozen=True)
class Rule:
    name: str
    pattern: re.Pattern


def _term_pattern(term: str) -> re.Pattern:
    words = normalized_forms(term)[0].split()
    return re.compile(r"\b" + r" ?".join(re.escape(w) for w in words) + r"\b")


def parse_rules(text: str, source: str) -> list[Rule]:
    """Rules of one blocklist file; every bad line is reported at once (ConfigError)."""
    rules, problems = [], []
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip() if not raw.lstrip().startswith("re:") else raw.strip()
        if not line:
            continue
        name, sep, pattern = line.partition(":")
        name, pattern = name.strip(), pattern.strip()
        if not sep or not re.fullmatch(r"[A-Za-z0-9][\w.-]*", name) or not pattern:
            problems.append(f"{source}:{n}: expected `rule-name: term` or `rule-name: re:REGEX`")
            continue
        if pattern.startswith("re:"):
            try:
                rules.append(Rule(name, re.compile(pattern[3:])))
            except re.error as e:
                problems.append(f"{source}:{n}: rule {name!r} has a bad regex ({e})")
        elif not normalized_forms(pattern):
            problems.append(f"{source}:{n}: rule {name!r} has no letters or digits to match")
        else:
            rules.append(Rule(name, _term_pattern(pattern)))
    if problems:
        raise ConfigError(problems)
    return rules


@lru_cache(maxsize=1)
def _default_text() -> str:
    """vidgen's own list, shipped in the package: it cannot change while a process runs."""
    return resources.files("vidgen.guard").joinpath("blocklists/default.txt").read_text(encoding="utf-8")


def _text(name: str) -> str:
    """The rule file's text, read now: an edited file applies from the next prompt checked, in a running
    service or worker too."""
    if name == "default":
        return _default_text()
    path = Path(name).expanduser()
    if not path.is_file():
        raise ConfigError(f"guard.blocklists: {name!r} is not a file; give a rule file or `default`")
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"guard.blocklists: {name!r} cannot be read as UTF-8 text ({e})") from None


@lru_cache(maxsize=16)
def _parse(text: str, source: str) -> tuple[Rule, ...]:
    """Parsed rules, cached by the file's content (never by its name alone: files change)."""
    return tuple(parse_rules(text, source))


def _load(name: str) -> tuple[Rule, ...]:
    return _parse(_text(name), "default blocklist" if name == "default" else name)


def load_rules(blocklists: list[str]) -> list[Rule]:
    """Every rule of the listed files (`default` = vidgen's own list)."""
    return [rule for name in blocklists for rule in _load(name)]


def match_prompt(prompt: str, rules: list[Rule]) -> str | None:
    """The name of the first rule the prompt matches, or None."""
    forms = normalized_forms(prompt)
    for rule in rules:
        if any(rule.pattern.search(f) for f in forms):
            return rule.name
    return None
