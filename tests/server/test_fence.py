"""A chat's JSON answer in a ```json fence, as the client gets it (fast: no model): the
fence and its spaces taken off however the answer is cut into pieces, a bare answer
left as it is, backticks inside the JSON kept."""

import pytest

from localspec.server.fence import Unfence


def unfenced(text: str, size: int) -> str:
    """What the client gets of `text` streamed in pieces of `size` characters."""
    unfence = Unfence()
    pieces = [text[i : i + size] for i in range(0, len(text), size)]
    return "".join(unfence.push(p) for p in pieces) + unfence.flush()


BODY = '{\n  "code": "print(1)  # ```not the end``` `x`",\n  "n": 2\n}'


@pytest.mark.parametrize("size", [1, 2, 3, 7, 1000])
@pytest.mark.parametrize(
    ("text", "want"),
    [
        (f"```json\n{BODY}\n```", BODY),
        (f"```json{BODY}```", BODY),  # the grammar leaves the spaces out as well
        (f"```json \n\t{BODY} \n ```", BODY),
        (BODY, BODY),  # bare: as written
        ('"`a` ```json"', '"`a` ```json"'),  # a bare string that holds the opening
        ("`", "`"),  # cut short before it could be told: nothing lost
    ],
)
def test_the_client_gets_the_json_alone(text: str, want: str, size: int):
    assert unfenced(text, size) == want


def test_a_fenced_answer_cut_short_loses_only_what_may_close_it():
    # max_tokens ends it inside a string: the held spaces and backticks are dropped
    assert unfenced('```json\n{"a": "b ``', 1) == '{"a": "b'
    assert unfenced("```json\n", 1) == ""
