/* What the token-file reader shares with the shard index: mapping one token file and checking
 * its header, without reading its tokens. */
#ifndef MESHTRAIN_TOKENS_INTERNAL_H
#define MESHTRAIN_TOKENS_INTERNAL_H

#include "meshtrain/data.h"

/* Maps the token file at path into shard (first 0, count from its header) and returns its
 * header's width and vocabulary bound; the header is checked against the file's size. */
mt_status trainer_tokens_map(mt_token_shard *shard, const char *path, int *width, uint32_t *vocab);
void trainer_tokens_unmap(mt_token_shard *shard);

#endif
