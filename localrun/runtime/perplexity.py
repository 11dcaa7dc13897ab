"""Perplexity of a model over a text: how surprised it is by each next token.

exp(mean negative log-likelihood) of every token after the first of each
window, the text cut into windows of ``window`` tokens evaluated from an empty
KV cache. Comparing it between KV cache types (or weight files) on the same
text shows what a setting costs in quality.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from localrun.runtime.decoder import Decoder
from localrun.runtime.engine import Engine

# A fixed English text shipped with localrun, so that `localrun bench`
# measures every setting on the same tokens on any machine.
REFERENCE_TEXT = """\
A lighthouse keeper's day began before sunrise. The lamp had burned all night,
and the first task was to trim the wick, polish the brass and clean the soot
from the great glass lens, so that the beam would be bright again by evening.
The lens itself was a marvel of patient work: rings of prisms, each ground by
hand, bent the light of a single flame into a narrow beam that sailors could
see twenty miles out at sea. A scratch on the glass, or a smear of oil, could
dim that beam, and so the keeper climbed the spiral stairs with a soft cloth
and a tin of fine powder long before anyone else on the island was awake.

After the lamp came the weather. Every few hours the keeper wrote down the
wind's direction and strength, the state of the sea, the height of the clouds
and how far one could see. These notes went into a logbook, and the logbooks
went, once a month, to the office on the mainland, where clerks copied them
into long tables. Over the years those tables became one of the best records
of the coast's weather that anyone had, and scientists still read them today
to learn how storms have changed.

Supplies arrived by boat when the sea allowed it, which in winter might mean
once in six weeks. The keeper's family grew vegetables in a walled garden that
kept off the salt wind, kept goats for milk, and stored flour, oil and coal in
a cellar cut into the rock. Children were taught at home, or rowed across to a
village school in the calm months. Visitors were rare and welcome; a passing
fisherman might trade a basket of mackerel for news and a cup of tea.

When fog rolled in, the light was not enough. Then the keeper started the fog
signal, a horn driven by compressed air, and sounded it in a fixed pattern so
that ships could tell this station from its neighbours along the coast. Each
lighthouse had its own rhythm of flashes as well: two short and one long, or a
steady light that was hidden for three seconds every ten. Charts listed these
patterns, and a navigator who counted the flashes knew at once which headland
lay ahead, even on a night with no moon and no stars.

Machines slowly took over the work. Electric lamps replaced oil, clockwork
gave way to motors, and at last automatic switches turned the light on at dusk
and off at dawn without anyone climbing the stairs. One by one the keepers
left, and the cottages at the foot of the towers stood empty or were let to
holidaymakers who wanted a week of wind and silence. The lights still turn
tonight, watched from a control room far away, but the logbooks, with their
careful handwriting and their small remarks about birds, ships and the colour
of the sky, remain as a record of the people who once kept them burning.

Bread is made from four things: flour, water, salt and yeast. Mix them and
the yeast begins to feed on the sugars in the flour, giving off gas that the
stretchy gluten in the dough traps in tiny bubbles. Kneading makes the gluten
stronger, so the dough can hold more gas and rise higher. A slow rise in a
cool place gives the yeast and the bacteria that live alongside it time to
make the acids and other compounds that give good bread its flavour; a quick
rise in a warm kitchen gives a loaf that is light but rather plain.

Shaping matters as much as mixing. A tight surface on the loaf lets it rise
upwards instead of spreading flat, and a cut across the top, made just before
baking, gives the expanding dough a place to open. In a hot oven the gas in
the bubbles expands, the water turns to steam, and the yeast works furiously
for a few minutes before the heat kills it. The crust browns as sugars and
proteins react at the surface, and the inside sets into a soft, open crumb.
A loaf should cool before it is cut, because the crumb is still cooking from
the heat it holds, and cutting it early lets the steam escape and leaves the
inside gummy.
"""


@dataclass(frozen=True)
class Perplexity:
    value: float
    tokens: int  # tokens scored


def perplexity(
    engine: Engine,
    tokens: Sequence[int],
    window: int = 512,
    progress: Callable[[int, int], None] | None = None,
) -> Perplexity:
    """Perplexity of ``engine``'s model over ``tokens``, window by window
    (each window at most the context and batch size). ``progress(done,
    total)`` is called after each window."""
    window = max(2, min(window, engine.n_ctx, engine.n_batch))
    starts = range(0, len(tokens) - 1, window)
    decoder = Decoder(engine)
    nll, count = 0.0, 0
    for i, start in enumerate(starts):
        chunk = tokens[start : start + window]
        decoder.rollback(0)
        if len(chunk) > 1:
            decoder.evaluate_rows(chunk)
            for row in range(len(chunk) - 1):
                logits = decoder.logits(row).astype(np.float64)
                top = logits.max()
                nll += float(top + np.log(np.exp(logits - top).sum()) - logits[chunk[row + 1]])
                count += 1
        if progress is not None:
            progress(i + 1, len(starts))
    decoder.rollback(0)
    if count == 0:
        raise ValueError("perplexity needs at least two tokens")
    return Perplexity(math.exp(nll / count), count)
