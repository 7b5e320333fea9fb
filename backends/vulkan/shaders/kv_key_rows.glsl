// Key rows of the KV cache (kv_row.glsl's formats) decoded into kv_row, encoded back, and rolled
// back by a number of positions: what kv_claim.comp's rolling and kv_rebalance.comp's rotations
// share. The including shader declares the `keys` buffer, KEY_FORMAT and p.head_dim, includes
// kv_row.glsl and rotary.glsl first, and defines rollback_cos_sin(shift, i): the cosine and sine
// that rotate pair i back by `shift` positions.

// Decodes the key row starting at word `row` into kv_row.
void load_key(uint row) {
    const uint data = row + kv_header_words(KEY_FORMAT), per_word = kv_elements_per_word(KEY_FORMAT);
    const uint header = keys[row];  // (a data word for the float formats; unused there)
    for (uint j = 0u; j < p.head_dim; ++j) kv_row[j] = kv_element(KEY_FORMAT, header, keys[data + j / per_word], j);
}

// Element j of the key row starting at word `row`, decoded.
float key_element(uint row, uint j) {
    return kv_element(KEY_FORMAT, keys[row], keys[row + kv_header_words(KEY_FORMAT) + j / kv_elements_per_word(KEY_FORMAT)], j);
}

// Encodes kv_row into the key row starting at word `row`.
void store_key(uint row) {
    const uint header = kv_encode_header(KEY_FORMAT, p.head_dim), skip = kv_header_words(KEY_FORMAT);
    if (skip != 0u) keys[row] = header;
    for (uint w = 0u; w + skip < kv_row_words(KEY_FORMAT, p.head_dim); ++w) {
        keys[row + skip + w] = kv_encode_word(KEY_FORMAT, p.head_dim, w);
    }
}

// Rotates the key row starting at word `row` back by `shift` positions, as KvCache::rotate_back
// does: decoded, its `pairs` rotary pairs (rotary.glsl's pairing) rotated, encoded again.
void roll_key_back(uint row, int shift, uint pairing, uint pairs) {
    load_key(row);
    for (uint i = 0u; i < pairs; ++i) {
        const uvec2 e = rotary_pair_elements(pairing, i, pairs);
        const vec2 r = rotate_pair(vec2(kv_row[e.x], kv_row[e.y]), rollback_cos_sin(shift, i));
        kv_row[e.x] = r.x;
        kv_row[e.y] = r.y;
    }
    store_key(row);
}
