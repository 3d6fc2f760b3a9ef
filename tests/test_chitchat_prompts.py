"""tools/chitchat_prompts.py: one asking turn of each conversation, a speaker's messages joined, the same draw each time."""
from chitchat_prompts import questions


def conversation(*groups):
    return {"messages": [[{"text": text} for text in group] for group in groups]}


CONVERSATIONS = {
    "a": conversation(["Hello", "How are you doing today?"], ["fine", "what did you do this weekend at the lake?"]),
    "b": conversation(["hi"], ["ok"]),  # nothing asked: left out
    "c": conversation(["Is it?"], ["that is a very long question " * 8 + "?"], ["do you like the new city so far?"]),
}


def test_one_asking_turn_per_conversation_joined_and_bounded_in_words():
    found = questions(CONVERSATIONS, seed=0)
    from_a = {"Hello How are you doing today?", "fine what did you do this weekend at the lake?"}
    assert len(found) == 2 and len(from_a & set(found)) == 1  # "b" asks nothing; one turn of "a"
    assert "do you like the new city so far?" in found  # "c": the others are too short or too long


def test_the_draw_is_fixed_by_the_seed():
    """The same seed draws the same turns in the same order; other seeds draw otherwise (twelve conversations of
    two asking turns each: 2^12 x 12! draws, so two seeds agree by chance about once in 2e12)."""
    many = {str(i): conversation([f"is question number {i} the first one here?"],
                                 [f"or is question number {i} the second one here?"]) for i in range(12)}
    drawn = questions(many, seed=3)
    assert drawn == questions(many, seed=3) and len(drawn) == 12
    others = [questions(many, seed=seed) for seed in (0, 1, 2, 4)]
    assert all(other != drawn for other in others)
    assert {tuple(sorted(other)) for other in others + [drawn]} != {tuple(sorted(drawn))}  # which turns, not only
    assert any(other[0].split()[3] != drawn[0].split()[3] for other in others)  # the order, varies with the seed
