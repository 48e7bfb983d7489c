// model/target/mixer.cpp — the table of token-mixer kinds (model/target/mixer.h): one row per kind, each descriptor
// defined in its own file.
#include "model/target/mixer.h"

namespace dflash {

extern const TokenMixerKind kAttentionMixer;      // model/target/attention.cpp
extern const TokenMixerKind kGatedDeltaNetMixer;  // model/target/linear_attention.cpp
extern const TokenMixerKind kLatentAttentionMixer;  // model/target/latent_attention.cpp

namespace {

const TokenMixerKind* const kMixers[] = {
    &kAttentionMixer,
    &kGatedDeltaNetMixer,
    &kLatentAttentionMixer,
};

}  // namespace

const TokenMixerKind& token_mixer(TokenMixer kind) {
  for (const TokenMixerKind* m : kMixers)
    if (m->kind == kind) return *m;
  DFLASH_FAIL("token mixer ", static_cast<int>(kind), " has no descriptor in model/target/mixer.cpp");
}

std::span<const TokenMixerKind* const> token_mixers() { return kMixers; }

}  // namespace dflash
