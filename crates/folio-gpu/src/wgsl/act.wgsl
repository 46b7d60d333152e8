// The gated activations, as the CPU (and llama.cpp) compute them: SiLU(g) * u, or
// GELU's tanh approximation of g (of g rounded to f16, the result rounded to f16, 0
// at or below -10 and g itself at or above 10) times u. Shared by the gate kernel
// (`elementwise.wgsl`'s `glu`) and the matmul that computes gate and up together
// (`matmul_common.wgsl`, gated): the same expressions, so the same bits.
fn gelu(x: f32) -> f32 {
    if (x <= -10.0) {
        return 0.0;
    }
    if (x >= 10.0) {
        return x;
    }
    let h = quantizeToF16(x);
    return quantizeToF16(0.5 * h * (1.0 + tanh(0.7978846 * h * (1.0 + 0.044715 * h * h))));
}

fn gated(g: f32, u: f32, is_gelu: bool) -> f32 {
    if (is_gelu) {
        return gelu(g) * u;
    }
    return g / (1.0 + exp(-g)) * u;
}
