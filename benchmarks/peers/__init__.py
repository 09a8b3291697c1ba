"""``pdserve bench peers``: pdserve against llama.cpp's server on the same weights and cores."""
