"""Token ids for ``/tokenize`` and ``/detokenize``: the stand-in's tokens are words (``simulate``).

Ids come from an interning table shared by the process (the same word always gets the same id,
and ``/detokenize`` turns ids back into words); the table stops growing at ``MAX_IDS`` and any new
word after that is ``<unk>`` (id 0), so memory stays bounded whatever clients send; a model with a
smaller vocabulary (config.json's ``vocab_size``) stops it there, so every id ``/tokenize`` gives
is one the engine takes back as a prompt.
"""

from __future__ import annotations

import threading
from typing import Dict, List

from .simulate import _TOKEN, VOCAB

MAX_IDS = 65536
UNK = "<unk>"


class Vocab:
    def __init__(self, size: int = MAX_IDS) -> None:
        """``size``: the model's vocabulary (config.json's vocab_size): no id is ever at or past it."""
        self.size = max(1, min(MAX_IDS, size))
        self._lock = threading.Lock()
        self._words: List[str] = [UNK]
        self._ids: Dict[str, int] = {UNK: 0}
        for word in VOCAB:
            self.id_of(word)

    def id_of(self, word: str) -> int:
        with self._lock:
            found = self._ids.get(word)
            if found is not None:
                return found
            if len(self._words) >= self.size:
                return 0
            self._ids[word] = len(self._words)
            self._words.append(word)
            return self._ids[word]

    def encode(self, text: str) -> List[int]:
        return [self.id_of(token) for token in _TOKEN.findall(text)]

    def decode(self, ids: List[int]) -> str:
        with self._lock:
            words = [self._words[i] if 0 <= i < len(self._words) else UNK for i in ids]
        return " ".join(words)

    def __len__(self) -> int:
        return len(self._words)
