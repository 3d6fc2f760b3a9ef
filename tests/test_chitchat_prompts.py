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
    assert questions(CONVERSATIONS, seed=3) == questions(CONVERSATIONS, seed=3)
