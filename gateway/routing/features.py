"""Cheap text features of a request for the difficulty router, computed in microseconds.

They complement the request's MiniLM embedding (which knows the topic) with what an
embedding blurs: how long the prompt is, how much arithmetic it asks for, whether it is code,
how many steps and constraints it sets, and how deep the conversation is. The same function
serves training (:mod:`gateway.tools.train_router`) and the request path, so the two never
drift.
"""

from __future__ import annotations

import math
import re
from typing import Any

import numpy as np

__all__ = ["FEATURE_NAMES", "text_features", "user_turns"]

_NUMBER = re.compile(r"(?<![\w.])\d[\d,]*(?:\.\d+)?")
_DECIMAL = re.compile(r"\d\.\d")
_PERCENT = re.compile(r"\d\s*%|\bpercent")
_FRACTION = re.compile(r"\b\d+/\d+\b|\bhalf\b|\bthird\b|\bquarter\b|\btwice\b|\bdouble\b")
_MONEY = re.compile(r"\$\s*\d|\bdollars?\b|\bcents?\b")
_MATH = re.compile(r"[=^+*/<>]|\\frac|\\sqrt|\bsqrt\b|\blog\b|\bsin\b|\bcos\b|\bintegral\b|"
                   r"\bderivative\b|\bequation\b|\bsolve\b|\bprobability\b|\bmod\b")
_CODE = re.compile(r"```|\bdef |\breturn\b|\bimport |[{};]|\bfunction\b|\bclass \b|\bSELECT\b|"
                   r"\bprint\(|==|->|\bint\b|\bstring\b|\barray\b|\bpython\b|\bjava\b|"
                   r"\bprogram\b|\balgorithm\b", re.IGNORECASE)
_STEPS = re.compile(r"\b(?:then|after|before|each|every|total|remaining|left|more than|"
                    r"less than|times|per|twice|first|second|third|finally|if|while|until|"
                    r"twice|another|rest|respectively)\b", re.IGNORECASE)
_CONSTRAINTS = re.compile(r"\b(?:must|exactly|at least|at most|only|except|without|not|"
                          r"never|no more than|no less than|all of|none of|both|neither|"
                          r"unless|instead)\b", re.IGNORECASE)
_CHOICE = re.compile(r"^[A-D][.)] ", re.MULTILINE)
_SENTENCE = re.compile(r"[.?!](?:\s|$)")

#: One name per column of :func:`text_features`.
FEATURE_NAMES = (
    "log_chars", "log_words", "log_numbers", "max_number_digits", "decimals", "percent",
    "fractions", "money", "math_symbols", "code_cues", "step_cues", "constraint_cues",
    "choices", "sentences", "questions", "log_depth",
)


def user_turns(messages: Any) -> int:
    """How many user messages the conversation holds (its depth)."""
    if not isinstance(messages, list):
        return 0
    return sum(1 for m in messages if isinstance(m, dict) and m.get("role") == "user")


def text_features(text: str, depth: int = 1) -> np.ndarray:
    """[len(FEATURE_NAMES)] float32: counts squashed with log1p so long prompts do not
    dominate. ``depth`` is the number of user turns (1 for a single question)."""
    numbers = _NUMBER.findall(text)
    words = len(text.split())
    digits = max((len(n.replace(",", "").split(".")[0]) for n in numbers), default=0)
    return np.array([
        math.log1p(len(text)),
        math.log1p(words),
        math.log1p(len(numbers)),
        float(digits),
        math.log1p(len(_DECIMAL.findall(text))),
        math.log1p(len(_PERCENT.findall(text))),
        math.log1p(len(_FRACTION.findall(text))),
        math.log1p(len(_MONEY.findall(text))),
        math.log1p(len(_MATH.findall(text))),
        math.log1p(len(_CODE.findall(text))),
        math.log1p(len(_STEPS.findall(text))),
        math.log1p(len(_CONSTRAINTS.findall(text))),
        float(len(_CHOICE.findall(text)) >= 2),
        math.log1p(len(_SENTENCE.findall(text))),
        math.log1p(text.count("?")),
        math.log1p(max(depth - 1, 0)),
    ], dtype=np.float32)
