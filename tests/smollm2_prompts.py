"""The 16 prompts every SmolLM2 parity check runs: running text of 8 to 1,500 tokens, then chats
(questions, and documents to summarise), 64 tokens out each. The offline test holds pdserve's
greedy tokens on them equal to transformers'; the served ones are checked against the offline."""

import lzma

from pdserve.cluster.make_model import CORPUS
from pdserve.engine.tokenizer import Tokenizer

MAX_NEW_TOKENS = 64
# Tokens of running text. transformers decodes each prompt alone, its weights read from memory once
# per token (~80 ms a step here, the bulk of the test), so only one prompt is long.
RAW_LENGTHS = (8, 16, 32, 64, 128, 256, 512, 1500)
QUESTIONS = (
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain what a Python decorator is, in two sentences.",
    "Name three programming languages and one thing each is good at.",
)
DOCUMENT_LENGTHS = (32, 64, 128, 256)  # tokens of text to summarise, in a chat
CORPUS_CHARS = 200_000  # enough text for every prompt


def parity_prompts(tokenizer: Tokenizer) -> list[list[int]]:
    """Running text cut to each raw length, then chats: questions, and documents to summarise."""
    text = lzma.decompress(CORPUS.read_bytes()).decode("utf-8")[:CORPUS_CHARS]
    ids = tokenizer.encode(text, add_special_tokens=False)
    starts = [sum(RAW_LENGTHS[:i]) for i in range(len(RAW_LENGTHS))]
    raw = [ids[start : start + n] for start, n in zip(starts, RAW_LENGTHS, strict=True)]
    rest = ids[sum(RAW_LENGTHS) :]
    documents = [tokenizer.decode(rest[:n]) for n in DOCUMENT_LENGTHS]
    chats = [[{"role": "user", "content": q}] for q in QUESTIONS] + [
        [{"role": "user", "content": f"Summarise this text in one sentence:\n\n{d}"}]
        for d in documents
    ]
    return raw + [tokenizer.apply_chat_template(chat, tokenize=True) for chat in chats]
