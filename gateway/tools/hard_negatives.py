"""Hard negatives and meaning-keeping positives for the semantic-cache verifier, by rule.

A cached answer must not be served for a question that looks the same but asks something
else: the direction of a conversion, a number, a negation, a name, a scope word. A
bi-encoder scores such pairs near 1.0 (it pools words and barely sees their order), so the
verifier is trained on them explicitly. Each rule takes one question and returns a changed
copy, or None when it does not apply; the pair (original, copy) is labelled 0 for the
negative kinds (the answer differs) and 1 for the rewrite kind (same meaning, other words).

The technique is the "minimal pair" / contrast-set idea (Gardner et al. 2020, "Evaluating
Models' Local Decision Boundaries via Contrast Sets"; Ribeiro et al. 2020, CheckList) used
as training data for a cross-encoder. Applied to ``qqp_pairs_dev`` texts it makes training
data; applied to ``qqp_pairs_test`` texts it makes the held-out hard-negative test set.

Pure functions, no I/O, deterministic for a given ``random.Random``.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

__all__ = ["NEGATIVE_KINDS", "RULES", "Pair", "change_entity", "change_negation",
           "change_number", "change_scope", "generate", "rewrite", "swap_direction"]

_LANGUAGES = ["English", "French", "German", "Spanish", "Hindi", "Chinese", "Japanese",
              "Russian", "Italian", "Arabic", "Portuguese", "Korean", "Tamil", "Urdu"]
_COUNTRIES = ["India", "China", "France", "Germany", "Japan", "Canada", "Australia",
              "Brazil", "Russia", "Italy", "Spain", "Mexico", "Pakistan", "USA", "UK",
              "America", "England", "Singapore", "Nepal", "Sweden", "Ireland", "Israel"]
_CITIES = ["Delhi", "Mumbai", "Bangalore", "Chennai", "London", "Paris", "Berlin", "Tokyo",
           "Boston", "Chicago", "Seattle", "Sydney", "Toronto", "Dubai", "Hyderabad",
           "Pune", "Kolkata", "Singapore", "Beijing", "Moscow", "California", "Texas"]
_ORGS = ["Google", "Facebook", "Amazon", "Apple", "Microsoft", "Quora", "Twitter", "Uber",
         "Netflix", "Samsung", "Infosys", "Flipkart", "IBM", "Intel", "Tesla", "Oracle"]
_TECH = ["Python", "Java", "JavaScript", "C++", "PHP", "Ruby", "Android", "iOS", "Windows",
         "Linux", "MATLAB", "SQL", "Excel", "iPhone", "Photoshop", "Hadoop"]
_PEOPLE = ["Trump", "Modi", "Obama", "Hillary", "Clinton", "Gandhi", "Einstein", "Newton",
           "Shakespeare", "Putin", "Musk", "Jobs", "Gates", "Zuckerberg", "Kejriwal"]
_UNITS = ["Celsius", "Fahrenheit", "Kelvin", "km", "miles", "meters", "feet", "inches", "cm",
          "kg", "pounds", "grams", "ounces", "liters", "gallons", "dollars", "rupees",
          "euros", "USD", "INR", "EUR", "GBP", "hours", "minutes", "seconds", "days",
          "weeks", "months", "years", "MB", "GB", "TB", "binary", "decimal", "hexadecimal",
          "PDF", "Word", "JPG", "PNG", "MP3", "MP4"]
_CATEGORIES = [_LANGUAGES, _COUNTRIES, _CITIES, _ORGS, _TECH, _PEOPLE]
_MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August",
           "September", "October", "November", "December"]
_DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
_UNIT_SWAPS = {"km": "miles", "miles": "km", "kg": "pounds", "pounds": "kg", "cm": "inches",
               "inches": "cm", "meters": "feet", "feet": "meters", "dollars": "rupees",
               "rupees": "dollars", "euros": "dollars", "hours": "minutes",
               "minutes": "hours", "days": "weeks", "weeks": "months", "months": "years",
               "years": "months", "GB": "MB", "MB": "GB", "Celsius": "Fahrenheit",
               "Fahrenheit": "Celsius", "liters": "gallons", "gallons": "liters"}
_SCOPE = {"all": "some", "some": "all", "before": "after", "after": "before", "more": "less",
          "less": "more", "most": "least", "least": "most", "best": "worst",
          "worst": "best", "increase": "decrease", "decrease": "increase",
          "always": "never", "first": "last", "last": "first", "above": "below",
          "below": "above", "maximum": "minimum", "minimum": "maximum", "cheapest":
          "most expensive", "easiest": "hardest", "hardest": "easiest", "fastest":
          "slowest", "biggest": "smallest", "smallest": "biggest", "richest": "poorest",
          "advantages": "disadvantages", "disadvantages": "advantages", "pros": "cons",
          "cons": "pros", "buy": "sell", "sell": "buy", "win": "lose", "gain": "lose",
          "lose": "gain", "start": "stop", "stop": "start", "positive": "negative",
          "negative": "positive", "good": "bad", "bad": "good", "higher": "lower",
          "lower": "higher", "legal": "illegal",
          "illegal": "legal", "with": "without", "without": "with", "men": "women",
          "women": "men", "male": "female", "female": "male", "past": "future"}
# Auxiliaries that take a plain "not"/"n't" (question-initial forms first).
_NEGATABLE = {"is": "isn't", "are": "aren't", "was": "wasn't", "were": "weren't",
              "does": "doesn't", "do": "don't", "did": "didn't", "can": "can't",
              "should": "shouldn't", "would": "wouldn't", "could": "couldn't",
              "will": "won't", "has": "hasn't", "have": "haven't"}
_UNNEGATE = {v: k for k, v in _NEGATABLE.items()} | {"cannot": "can"}
# Meaning-keeping rewrites: (pattern, replacement), applied case-insensitively at word level.
_REWRITES: list[tuple[str, str]] = [
    (r"\bwhat is\b", "what's"), (r"\bwhat's\b", "what is"), (r"\bhow is\b", "how's"),
    (r"\bwho is\b", "who's"), (r"\bwhere is\b", "where's"), (r"\bit is\b", "it's"),
    (r"\bdo not\b", "don't"), (r"\bdon't\b", "do not"), (r"\bdoes not\b", "doesn't"),
    (r"\bcan not\b", "can't"), (r"\bcannot\b", "can't"), (r"\bi am\b", "I'm"),
    (r"\bhow do i\b", "how can I"), (r"\bhow can i\b", "how do I"),
    (r"\bhow should i\b", "how do I"), (r"\bwhat is the best way to\b", "how do I"),
    (r"\bhow do you\b", "how does one"), (r"\bwhat are some\b", "what are"),
    (r"\bwhat are the\b", "what are some of the"), (r"\bwhich is the best\b",
                                                     "what is the best"),
    (r"\bwhat is the best\b", "which is the best"), (r"\bcapital\b", "capital city"),
    (r"\bmovie\b", "film"), (r"\bmovies\b", "films"), (r"\bbuy\b", "purchase"),
    (r"\bstart\b", "begin"), (r"\bbegin\b", "start"), (r"\bquickly\b", "fast"),
    (r"\bcheap\b", "inexpensive"), (r"\bbig\b", "large"), (r"\bhelp\b", "assist"),
    (r"\bimprove\b", "get better at"), (r"\bget rid of\b", "remove"),
    (r"\bphone\b", "mobile phone"), (r"\bcar\b", "automobile"), (r"\bkids\b", "children"),
    (r"\bjob\b", "position"), (r"\bhappy\b", "glad"), (r"\buse\b", "utilize"),
]


@dataclass(frozen=True, slots=True)
class Pair:
    """One generated pair: ``a`` the original question, ``b`` the changed one; ``label`` 1
    when they ask the same thing, 0 when not; ``kind`` the rule that made it."""

    a: str
    b: str
    label: int
    kind: str


_FUNCTION_WORDS = frozenset({"a", "an", "the", "my", "your", "his", "her", "their", "our",
                             "this", "that", "it", "i", "you", "me", "how", "what", "which",
                             "why", "who", "when", "where", "is", "are", "be", "do", "get",
                             "go", "time", "one", "some", "any", "there", "here", "back"})


def _swapable(word: str) -> bool:
    """A side of "X to Y" worth swapping: a name, a language, a unit or a format."""
    return word in _UNITS or (word[:1].isupper() and word.lower() not in _FUNCTION_WORDS)


def _content(side: str) -> bool:
    """A side of "from X to Y" that names something (not "from a to ...")."""
    return side.split()[0].lower() not in _FUNCTION_WORDS and not side.isdigit()


_FROM_TO = re.compile(r"\bfrom ([\w+#]+(?: [A-Z][\w+#]*)?) to ([\w+#]+(?: [A-Z][\w+#]*)?)\b")
_X_TO_Y = re.compile(r"\b([\w+#]+) (to|into|vs\.?|versus) ([\w+#]+)\b")
_VERB_X_TO_Y = re.compile(r"\b(convert|converting|translate|translating|switch|switching|"
                          r"move|moving|migrate|migrating|transfer|transferring|change|"
                          r"changing|port|porting|upgrade|upgrading) ([\w+#]+) (to|into) "
                          r"([\w+#]+)\b", re.IGNORECASE)
_POSSESSIVE = re.compile(r"\b([A-Z][\w]+)'s (\w+(?: \w+)?) (to|with|against) ([A-Z][\w]+)\b")


def swap_direction(text: str, rng: random.Random | None = None) -> str | None:
    """Swap the sides of "from X to Y", "X to Y" / "X into Y" (names, languages, units),
    "X vs Y", and "X's ... to Y": "convert Celsius to Fahrenheit" -> "convert Fahrenheit
    to Celsius". None when no such phrase is found."""
    m = _FROM_TO.search(text)
    if m and m.group(1) != m.group(2) and _content(m.group(1)) and _content(m.group(2)):
        return f"{text[:m.start()]}from {m.group(2)} to {m.group(1)}{text[m.end():]}"
    m = _POSSESSIVE.search(text)
    if m and m.group(1) != m.group(4):
        return (f"{text[:m.start()]}{m.group(4)}'s {m.group(2)} {m.group(3)} {m.group(1)}"
                f"{text[m.end():]}")
    m = _VERB_X_TO_Y.search(text)
    if m and m.group(2) != m.group(4) and _content(m.group(2)) and _content(m.group(4)):
        verb, x, op, y = m.groups()
        return f"{text[:m.start()]}{verb} {y} {op} {x}{text[m.end():]}"
    for m in _X_TO_Y.finditer(text):
        x, op, y = m.groups()
        if x != y and _swapable(x) and _swapable(y):
            return f"{text[:m.start()]}{y} {op} {x}{text[m.end():]}"
    return None


_NUM = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?)(?![\w.]*\d)")
_UNIT_WORD = re.compile(r"\b(" + "|".join(map(re.escape, _UNIT_SWAPS)) + r")\b")
_DATE_WORD = re.compile(r"\b(" + "|".join(_MONTHS + _DAYS) + r")\b")


def _new_number(old: str, rng: random.Random) -> str:
    """Another number of the same form: decimals move by 0.5-2, years by a few, counts by a
    small step or doubling."""
    if "." in old:
        return f"{float(old) + rng.choice([0.5, 1.5, 2.0]):.{len(old.split('.')[1])}f}"
    n = int(old)
    if 1900 <= n <= 2100:
        return str(n + rng.choice([-3, -2, -1, 1, 2]))
    if n > 10 and rng.random() < 0.3:
        return str(n * 2)
    return str(n + rng.choice([1, 2, 3, 5, 10]))


def change_number(text: str, rng: random.Random) -> str | None:
    """Change one number, unit, month or weekday: "10 km" -> "12 km", "in 2016" -> "in
    2019", "5 kg" -> "5 pounds", "in May" -> "in August". None when there is none."""
    spans: list[tuple[int, int, str]] = []  # (start, end, the changed word)
    for m in _NUM.finditer(text):
        spans.append((m.start(1), m.end(1), _new_number(m.group(1), rng)))
    for m in _UNIT_WORD.finditer(text):
        if not re.search(rf"\b{_UNIT_SWAPS[m.group(1)]}\b", text):
            # (not "Celsius to Fahrenheit": that is the direction rule's)
            spans.append((m.start(), m.end(), _UNIT_SWAPS[m.group(1)]))
    for m in _DATE_WORD.finditer(text):
        pool = _MONTHS if m.group(1) in _MONTHS else _DAYS
        spans.append((m.start(), m.end(), rng.choice([p for p in pool if p != m.group(1)])))
    if not spans:
        return None
    start, end, new = rng.choice(spans)
    return text[:start] + new + text[end:]


_AUX = re.compile(r"\b(" + "|".join(_NEGATABLE) + r")\b", re.IGNORECASE)
_NEG = re.compile(r"\b(not |never )|\b(" + "|".join(map(re.escape, _UNNEGATE)) + r")(?!\w)",
                  re.IGNORECASE)


def _swap(text: str, m: re.Match[str], new: str, word: str) -> str:
    """``text`` with ``m``'s span replaced by ``new``, capitalised when ``word`` is."""
    new = new.capitalize() if word[0].isupper() else new
    return text[:m.start()] + new + text[m.end():]


def change_negation(text: str, rng: random.Random | None = None) -> str | None:
    """Remove a negation when there is one ("Why can't I sleep?" -> "Why can I sleep?"),
    else negate the first auxiliary ("Is it safe?" -> "Isn't it safe?", "Why do birds
    sing?" -> "Why don't birds sing?"). None when neither applies."""
    m = _NEG.search(text)
    if m:
        if m.group(1):
            return text[:m.start()] + text[m.end():]
        word = m.group(2)
        plain = _UNNEGATE.get(word.lower())
        if plain is None:
            return None
        return _swap(text, m, plain, word)
    m = _AUX.search(text)
    if not m:
        return None
    word = m.group(1)
    neg = _NEGATABLE.get(word.lower())
    if neg is None:  # a look-alike under Unicode case folding ("İs")
        return None
    if m.start() == 0 or text[:m.start()].strip().lower() in {"why", "how", "what", "when",
                                                             "where", "who", "which"}:
        return _swap(text, m, neg, word)
    return text[:m.end()] + " not" + text[m.end():]


_CATEGORY_OF = {name: category for category in _CATEGORIES for name in category}
_ENTITY = re.compile(r"(?<![\w+])(" + "|".join(
    map(re.escape, sorted(_CATEGORY_OF, key=len, reverse=True))) + r")(?![\w+])")


def change_entity(text: str, rng: random.Random) -> str | None:
    """Swap a named entity (a country, city, language, company, person or technology) for
    another of the same category: "jobs in India" -> "jobs in Canada". None when no known
    name occurs."""
    found = list(_ENTITY.finditer(text))
    if not found:
        return None
    m = rng.choice(found)
    category = _CATEGORY_OF[m.group(0)]
    new = rng.choice([n for n in category if n != m.group(0)])
    return text[:m.start()] + new + text[m.end():]


_SCOPE_WORD = re.compile(r"\b(" + "|".join(map(re.escape, _SCOPE)) + r")\b", re.IGNORECASE)


def change_scope(text: str, rng: random.Random) -> str | None:
    """Flip a scope or polarity word: all/some, before/after, more/less, best/worst,
    advantages/disadvantages...: "What should I do before an interview?" -> "... after an
    interview?". None when there is none."""
    found = list(_SCOPE_WORD.finditer(text))
    if not found:
        return None
    m = rng.choice(found)
    word = m.group(1)
    new = _SCOPE.get(word.lower())
    if new is None:
        return None
    return _swap(text, m, new, word)


def rewrite(text: str, rng: random.Random) -> str | None:
    """A meaning-keeping rewrite: contractions ("What is" <-> "What's"), question frames
    ("How do I" <-> "How can I"), synonyms ("capital" -> "capital city", "movie" -> "film").
    None when no rule applies."""
    options = [(p, r) for p, r in _REWRITES if re.search(p, text, re.IGNORECASE)]
    if not options:
        return None
    pattern, repl = rng.choice(options)
    m = re.search(pattern, text, re.IGNORECASE)
    assert m is not None
    if m.group(0)[:1].isupper():
        repl = repl[:1].upper() + repl[1:]
    return text[:m.start()] + repl + text[m.end():]


#: kind -> (rule, label of the pair it makes)
RULES: dict[str, tuple[Callable[[str, random.Random], str | None], int]] = {
    "direction": (swap_direction, 0), "number": (change_number, 0),
    "negation": (change_negation, 0), "entity": (change_entity, 0),
    "scope": (change_scope, 0), "rewrite": (rewrite, 1)}
NEGATIVE_KINDS = tuple(k for k, (_, label) in RULES.items() if label == 0)


def generate(texts: Iterable[str], rng: random.Random, per_kind: int | None = None
             ) -> list[Pair]:
    """Every kind's pairs from ``texts`` (each text used at most once per kind), at most
    ``per_kind`` of each kind; texts are visited in a seeded shuffled order."""
    pool = list(dict.fromkeys(t.strip() for t in texts if t.strip()))
    rng.shuffle(pool)
    out: list[Pair] = []
    for kind, (rule, label) in RULES.items():
        n = 0
        for text in pool:
            if per_kind is not None and n >= per_kind:
                break
            changed = rule(text, rng)
            if changed is not None and changed.strip() != text and \
                    changed.lower() != text.lower():
                out.append(Pair(text, changed, label, kind))
                n += 1
    return out
