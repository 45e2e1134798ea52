"""Detokenizing: generated token ids into text as they arrive, the thinking apart from the answer.
Torch-free, so request bookkeeping can hold one."""


class Detokenizer:
    """Incremental detokenizer: returns only the new text each token adds.

    Decodes a short window (from the last emitted boundary) rather than the whole answer on every token.
    Byte-level tokens can end mid-character; such a tail decodes to U+FFFD and is held back until the
    character completes, or until `flush` at the end of the answer.
    """

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.token_ids: list[int] = []
        self._window_start = 0  # the window's text up to _emitted_end was already returned
        self._emitted_end = 0

    def _text(self, start: int, end: int | None = None) -> str:
        return self.tokenizer.decode(self.token_ids[start:end], skip_special_tokens=True)

    def add(self, token_id: int) -> str:
        self.token_ids.append(token_id)
        done = self._text(self._window_start, self._emitted_end)
        text = self._text(self._window_start)
        if len(text) <= len(done) or text.endswith("\ufffd"):
            return ""
        self._window_start, self._emitted_end = self._emitted_end, len(self.token_ids)
        return text[len(done) :]

    def flush(self) -> str:
        """What is still held back (an incomplete character at the very end)."""
        done = self._text(self._window_start, self._emitted_end)
        text = self._text(self._window_start)
        self._window_start = self._emitted_end = len(self.token_ids)
        return text[len(done) :]


class SplitDetokenizer:
    """A request's generated tokens in two parts: the thinking, every token up to and including the
    think-end token, and the answer after it. Each part has a Detokenizer of its own, so a character never
    straddles the two; the think-end token's own text is in neither. think_end None: all of it is answer.

    token_ids holds every generated token; thinking_tokens counts the thinking part's.
    """

    def __init__(self, tokenizer, think_end: int | None):
        self.token_ids: list[int] = []
        self.thinking_tokens = 0
        self._think_end = think_end
        self._thinking = think_end is not None  # still inside the thinking
        self._parts = {"thinking": Detokenizer(tokenizer), "text": Detokenizer(tokenizer)}
        self._separating = False  # between the think-end token and the answer's first text

    @property
    def _part(self) -> str:
        """The part the next token goes to: "thinking" or "text" (the answer), as the stream's event kinds."""
        return "thinking" if self._thinking else "text"

    def add(self, token_id: int) -> tuple[str, str]:
        """(part, the new text this token adds to it)."""
        self.token_ids.append(token_id)
        part = self._part
        if part == "text":
            return part, self._answer_text(self._parts[part].add(token_id))
        self.thinking_tokens += 1
        if token_id == self._think_end:
            self._thinking, self._separating = False, True
            return part, self._parts[part].flush()
        return part, self._parts[part].add(token_id)

    def flush(self) -> tuple[str, str]:
        """(part, what the current part still holds back) at the end of the request."""
        part = self._part
        tail = self._parts[part].flush()
        return part, self._answer_text(tail) if part == "text" else tail

    def _answer_text(self, text: str) -> str:
        # The newlines after the think-end token only separate the parts: the chat template drops them too
        # (`content.split('</think>')[-1].lstrip('\n')`).
        if not self._separating:
            return text
        text = text.lstrip("\n")
        self._separating = not text
        return text
