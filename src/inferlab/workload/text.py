"""Built-in English text: the word list synthetic prompts draw from and the passage the
simulator "generates". Words are plain lowercase ASCII so that each one, with its
leading space, is a single token for the simulator's tokenizer and, for almost all of
them, for real BPE tokenizers too.
"""

from __future__ import annotations

import re

PASSAGE = (
    "Retrieval augmented generation, or RAG, lets a language model answer from fresh "
    "documents instead of only what it learned during training. A retriever first turns "
    "the question into a vector and finds the passages closest to it in an index. Those "
    "passages are placed in the prompt next to the question, and the model writes an "
    "answer that can quote them. The answer is only as good as the retrieved text, so "
    "teams measure recall, keep chunks short, and rerank the best candidates before "
    "generation. Serving such a system well is a matter of latency as much as quality. "
    "Long prompts make the prefill phase slow, because every token of context must pass "
    "through the model before the first word appears. Decoding then produces one token "
    "at a time, and its speed depends on how many requests share each batch and how "
    "fast the weights stream from memory. A prefix cache helps when many requests share "
    "the same system prompt, since the server can reuse the keys and values it already "
    "computed. Good operators watch the time to first token, the time per output token, "
    "and the throughput of the whole fleet, and they tune batch size, context length and "
    "quantization until the service meets its goals at a fair cost.\n"
)
# (the simulated model writes this passage over and over: it ends in a line break, so
# that where one pass meets the next ("cost.\nRetrieval") the text tokenizes into the
# same tokens the model wrote, as a real model's answer does when a conversation sends
# it back, and a prefix cache finds it)

_EXTRA_WORDS = ["the", "of", "and", "to", "in", "is", "it", "that", "for", "on", "with", "as", "was", "at", "by", "be", "this", "are", "from", "or", "have", "an", "not", "they", "which", "one", "you", "were", "all", "we", "when", "there", "can", "more", "if", "out", "so", "what", "up", "about", "into", "than", "them", "some", "could", "time", "these", "two", "may", "first", "then", "do", "any", "like", "my", "now", "over", "such", "our", "man", "me", "even", "most", "made", "after", "also", "did", "many", "before", "must", "through", "back", "years", "where", "much", "your", "way", "well", "down", "should", "because", "each", "just", "those", "people", "how", "too", "little", "state", "good", "very", "make", "world", "still", "own", "see", "men", "work", "long", "get", "here", "between", "both", "life", "being", "under", "never", "day", "same", "another", "know", "while", "last", "might", "us", "great", "old", "year", "off", "come", "since", "against", "go", "came", "right", "used", "take", "three", "states", "himself", "few", "house", "use", "during", "without", "again", "place", "around", "however", "home", "small", "found", "thought", "went", "say", "part", "once", "general", "high", "upon", "school", "every", "does", "got", "united", "left", "number", "course", "war", "until", "always", "away", "something", "fact", "though", "water", "less", "public", "put", "think", "almost", "hand", "enough", "far", "took", "head", "yet", "government", "system", "better", "set", "told", "nothing", "night", "end", "why", "called", "didn", "find", "going", "look", "asked", "later", "knew", "point", "next", "program", "city", "business", "give", "group", "toward", "young", "days", "let", "room", "president", "side", "social", "given", "present", "several", "order", "national", "possible", "rather", "second", "face", "per", "among", "form", "important", "often", "things", "looked", "early", "white", "case", "john", "become", "large", "big", "need", "four", "within", "felt", "along", "children", "saw", "best", "church", "ever", "least", "power", "development", "light", "thing", "seemed", "family", "interest", "want", "members", "mind", "country", "area", "others", "done", "turn", "although", "open", "god", "service", "certain", "kind", "problem", "began", "different", "door", "thus", "help", "sense", "means", "whole", "matter", "perhaps", "itself", "york", "times", "law", "human", "line", "above", "name", "example", "action", "company", "hands", "local", "show", "whether", "five", "history", "gave", "today", "either", "act", "feet", "across", "taken", "past", "quite", "anything", "having", "seen", "death", "experience", "body", "word", "half", "really", "week", "car", "field", "information", "free", "already", "themselves", "money", "university", "level", "tell", "million", "brought", "cannot", "simply", "held", "model", "token", "batch", "cache", "memory", "server", "request", "prompt", "latency", "output", "input", "queue", "prefix", "decode", "prefill", "throughput", "engine", "layer", "weight", "vector", "index", "search", "answer", "question", "text"]

_WORD = re.compile(r"[a-z]+")


def _vocabulary() -> tuple[str, ...]:
    seen: dict[str, None] = {}
    for w in _WORD.findall(PASSAGE.lower()) + _EXTRA_WORDS:
        seen.setdefault(w, None)
    return tuple(seen)


#: Distinct lowercase words, in a fixed order (deterministic across runs and machines).
WORDS: tuple[str, ...] = _vocabulary()
