"""Which special tokens a prompt may be tokenized apart at (localspec.backends.pieces)."""

from localspec.backends.pieces import splitters


def test_only_tokens_whose_every_occurrence_llama_cpp_takes_are_split_at() -> None:
    specials = [
        (1, "<|im_start|>", False),
        (2, "<|im_end|>", False),
        (3, "<turn>", False),
        (4, "<turn>x", False),  # contains <turn>: it takes some of them
        (5, "<call>", False),
        (6, "ll>[", False),  # begins as <call> ends: "<call>[" is one or the other
        (7, "<ret>", False),
        (8, "]<re", False),  # ends as <ret> begins
        (9, "<eot>", True),  # strips the spaces beside it
        (10, "<sep>", False),
        (11, "<sep>", False),  # two tokens of one text
        (12, "<unused>", False),  # not in the template
    ]
    written = "<|im_start|><|im_end|><turn><call><ret><eot><sep>"
    assert splitters(specials, written) == {"<|im_start|>": 1, "<|im_end|>": 2}
    assert splitters([*specials, (12, "", False)], written) == {}
