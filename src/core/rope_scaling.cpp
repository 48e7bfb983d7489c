// core/rope_scaling.cpp — see rope_scaling.h.
#include "core/rope_scaling.h"

#include <cmath>

namespace dflash {

namespace {

// transformers' get_mscale of _compute_yarn_parameters.
double yarn_mscale(double scale, double mscale) { return scale <= 1 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0; }

}  // namespace

double RopeScaling::attention_scaling() const {
  if (kind != "yarn") return 1.0;
  if (attention_factor > 0) return attention_factor;
  if (mscale != 0 && mscale_all_dim != 0) return yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all_dim);
  return yarn_mscale(factor, 1.0);
}

}  // namespace dflash
