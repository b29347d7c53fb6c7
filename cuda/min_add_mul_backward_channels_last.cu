// min_add_mul_backward_channels_last.cu — P31's min rule from the kept shares (v4 of
// channelwise_backward.cu's min_add_mul_backward), written channels-last.
//
// conv2d's two gradients read dy from a channels-last copy (N, H, W, C): the input gradient
// v3 stages it with the copy engine, the weight gradient v3 too (conv_backward_tensor_cores.cuh,
// conv2d_grads_shared_launch). In P31's backward that dy is the min's gradient, which v2 wrote
// NCHW in one pass (reading the output's gradient and the kept shares) and the copy then read
// and wrote again. Here the rule fills channels_last.cuh's transposing tile and its store half
// writes the copy: two passes over the gradient's bytes made one. In float (3xTF32) it can
// store each tile twice instead, as the two TF32 parts the input gradient v4 reads
// (min_add_mul_backward_kept_split_launch; v4's own split pass then has nothing to do). The
// two bias gradients come on the way, summed in an order of this pass's own (below), fixed by
// the shape: the same bits on every run and GPU, which may differ from channel_sums' in the
// last bit.
//
// dx[n][p][c] = dy[n][c][p] * factor * halves[n][c][p] / 2 (T rounded as v2: element.cuh),
// bias_grad[c] = factor * sum of dy over channel c, conv_bias_grad[c] = sum of dx over it.

#include "channels_last.cuh"
#include "common.cuh"
#include "launchers.h"

namespace scratchops {
namespace {

// channels_last.cuh's 64 x 64 tiles (channels x pixels) filled with v2's values. Block
// (piece, channel block) = (blockIdx.x, blockIdx.y) walks image piece / pieces_image's pixel
// tiles [j kKeptTilesPiece, (j + 1) kKeptTilesPiece), j = piece % pieces_image, in order,
// the next tile's loads in flight while it works on this one (a load takes microseconds under
// the pass's own stores, and 3 or 4 blocks an SM hold too few bytes in flight without them).
// The fill: thread t loads a quad of 4 pixels, 4 (t % 16) to 4 (t % 16) + 3, of channel rows
// t / 16 + 16 k, k < 4: a row's 16 quads are one half-warp's (128 bytes of 16-bit dy, 64 of
// shares), one load each of dy and shares where quads_aligned (pixels % 4 == 0 and the
// pointers aligned to a quad of each), else value by value. Each thread keeps double sums of
// its rows' dy and dx over the piece (a quad's 4 terms added in float first: an error of at
// most 3 x 2^-24 of their magnitudes, far below the half types' rounding, while the quad's
// sum stays in float's range: bf16 terms near 1.7e38 can overflow it where a double sum would
// not, as torch's own float-accumulated bf16 sums can); at the end a row's 16 lanes add
// theirs by xor shuffles (every lane ends with the same sum) into partial[c * pieces + piece],
// and kept_sums_finish adds a channel's partials in an order fixed by the shape alone, so the
// bits do not depend on the GPU or the run.
constexpr int kKeptTilesPiece = 64;                    // a block's tiles: 4,096 pixels at most
constexpr int kQuad = 4;                               // pixels a thread loads of a row
constexpr int kQuadsRow = kVecTile / kQuad;            // 16 lanes a tile row
constexpr int kKeptThreads = 256;
constexpr int kRowsPass = kKeptThreads / kQuadsRow;    // 16 rows a pass of the block
constexpr int kPasses = kVecTile / kRowsPass;          // 4 rows a thread
static_assert(kQuadsRow == 16, "a row's lanes are one half-warp (the shuffles' offsets)");

inline int kept_pieces_image(int pixels) {
    const int tiles = (pixels + kVecTile - 1) / kVecTile;
    return (tiles + kKeptTilesPiece - 1) / kKeptTilesPiece;
}

// A thread's loads of one tile, as bits: each row's quad of dy (kQuad values of T in 32-bit
// words) and of shares (a byte each); zeros outside the image (g = +0, share 0: d = 0 there
// and in the sums for a finite factor; an infinite factor makes the conv bias's sum NaN).
template <class T>
struct KeptQuads {
    static constexpr int kPerWord = 4 / static_cast<int>(sizeof(T));
    uint32_t g[kPasses][kQuad / kPerWord];
    uint32_t h[kPasses];
};

template <class T>
__device__ __forceinline__ void load_kept_quads(KeptQuads<T>& q, const T* __restrict__ dy,
                                                const uint8_t* __restrict__ halves,
                                                long long image_offset, int c0, int row0, int p,
                                                int channels, int pixels, bool quads_aligned) {
    constexpr int kPerWord = KeptQuads<T>::kPerWord;
#pragma unroll
    for (int k = 0; k < kPasses; ++k) {
        const int c = c0 + row0 + k * kRowsPass;
        const long long at = image_offset + static_cast<long long>(c) * pixels + p;
#pragma unroll
        for (int w = 0; w < kQuad / kPerWord; ++w) q.g[k][w] = 0u;
        q.h[k] = 0u;
        if (c < channels && quads_aligned && p < pixels) {
            if constexpr (sizeof(T) == 4) {
                const uint4 v = *reinterpret_cast<const uint4*>(dy + at);
                q.g[k][0] = v.x, q.g[k][1] = v.y, q.g[k][2] = v.z, q.g[k][3] = v.w;
            } else {
                const uint2 v = *reinterpret_cast<const uint2*>(dy + at);
                q.g[k][0] = v.x, q.g[k][1] = v.y;
            }
            q.h[k] = *reinterpret_cast<const uint32_t*>(halves + at);
        } else if (c < channels) {
#pragma unroll
            for (int i = 0; i < kQuad; ++i) {
                if (p + i >= pixels) break;
                q.g[k][i / kPerWord] |= element_bits(dy[at + i]) << (16 * (i % kPerWord));
                q.h[k] |= static_cast<uint32_t>(halves[at + i]) << (8 * i);
            }
        }
    }
}

template <class T>
__device__ __forceinline__ float kept_quad_value(const KeptQuads<T>& q, int k, int i) {
    if constexpr (sizeof(T) == 4) {
        return __uint_as_float(q.g[k][i]);
    } else {
        return to_float(half_from_bits<T>(static_cast<unsigned short>(q.g[k][i / 2] >>
                                                                      (16 * (i % 2)))));
    }
}

// kSplit (float): the gradient stored as its two TF32 parts, big into dx_cl and small into
// dx_small (channels_last.cuh's two stores, as the input gradient v4's split pass makes them).
template <class T, bool kSplit = false>
// (16-bit: 64 registers, 4 blocks an SM; float's twice as many bits of dy need 80, 3 blocks)
__global__ void __launch_bounds__(kKeptThreads, sizeof(T) == 4 ? 3 : 4)
    min_add_mul_backward_kept_channels_last_kernel(
        const T* __restrict__ dy, const uint8_t* __restrict__ halves, T* __restrict__ dx_cl,
        T* __restrict__ dx_small, float* __restrict__ dy_partial, float* __restrict__ dx_partial,
        int channels, int pixels, int pieces_image, float factor, bool quads_aligned) {
    __shared__ T tile[kVecTile][kVecTile + 1];
    const int piece = blockIdx.x, c0 = blockIdx.y * kVecTile;
    const long long image_offset =
        static_cast<long long>(piece / pieces_image) * channels * pixels;
    const int tiles = (pixels + kVecTile - 1) / kVecTile;
    const int t_begin = piece % pieces_image * kKeptTilesPiece;
    const int t_end = t_begin + kKeptTilesPiece < tiles ? t_begin + kKeptTilesPiece : tiles;
    const int quad = threadIdx.x % kQuadsRow, row0 = threadIdx.x / kQuadsRow;
    double dy_sum[kPasses] = {}, dx_sum[kPasses] = {};
    KeptQuads<T> next;  // (t_begin < t_end: every piece has a tile)
    load_kept_quads(next, dy, halves, image_offset, c0, row0, t_begin * kVecTile + quad * kQuad,
                    channels, pixels, quads_aligned);
    for (int t = t_begin; t < t_end; ++t) {
        const KeptQuads<T> q = next;
        if (t + 1 < t_end)  // (tile t + 1's quads, in flight during this tile's work)
            load_kept_quads(next, dy, halves, image_offset, c0, row0,
                            (t + 1) * kVecTile + quad * kQuad, channels, pixels, quads_aligned);
#pragma unroll
        for (int k = 0; k < kPasses; ++k) {
            float g_quad = 0.0f, d_quad = 0.0f;  // (4 terms in float, then one double add)
#pragma unroll
            for (int i = 0; i < kQuad; ++i) {
                const float g = kept_quad_value(q, k, i);
                const T d = min_rule_from_halves<T>(g, factor, (q.h[k] >> (8 * i)) & 0xffu);
                tile[row0 + k * kRowsPass][quad * kQuad + i] = d;
                g_quad += g;
                d_quad += to_float(d);
            }
            dy_sum[k] += g_quad;
            dx_sum[k] += d_quad;
        }
        __syncthreads();
        if constexpr (kSplit) {
            channels_last_tile_store<T, true>(tile, dx_cl + image_offset, channels, pixels, c0,
                                              t * kVecTile, threadIdx.x, kKeptThreads);
            channels_last_tile_store<T, true, true>(tile, dx_small + image_offset, channels,
                                                    pixels, c0, t * kVecTile, threadIdx.x,
                                                    kKeptThreads);
        } else {
            channels_last_tile_store<T, false>(tile, dx_cl + image_offset, channels, pixels, c0,
                                               t * kVecTile, threadIdx.x, kKeptThreads);
        }
        __syncthreads();  // (the tile is filled again)
    }
#pragma unroll
    for (int k = 0; k < kPasses; ++k) {
        double a = dy_sum[k], b = dx_sum[k];
#pragma unroll
        for (int offset = kQuadsRow / 2; offset > 0; offset /= 2) {
            a += __shfl_xor_sync(0xffffffffu, a, offset);
            b += __shfl_xor_sync(0xffffffffu, b, offset);
        }
        const int c = c0 + row0 + k * kRowsPass;
        if (quad == 0 && c < channels) {
            dy_partial[static_cast<long long>(c) * gridDim.x + piece] = static_cast<float>(a);
            dx_partial[static_cast<long long>(c) * gridDim.x + piece] = static_cast<float>(b);
        }
    }
}

// The sums finished, kWarps warps a channel (blockIdx.x): thread t adds the channel's partials
// t, t + 32 kWarps, ... in order, then each warp its 32 by xor shuffles, then warp 0 the
// warps' sums in warp order (one thread a channel, as channel_sums_finish, took 46 us over
// P31's 512 partials a channel: a chain of dependent loads; a warp a channel took 48 us over
// the one pass's 16,128, where 8 warps share them). bias_grad = factor * dy's sum,
// conv_bias_grad = dx's.
template <class T, int kWarps>
__global__ void kept_sums_finish_kernel(const float* __restrict__ dy_partial,
                                        const float* __restrict__ dx_partial, float factor,
                                        T* __restrict__ bias_grad, T* __restrict__ conv_bias_grad,
                                        int pieces) {
    __shared__ double warp_sums[2][kWarps];
    const long long row = static_cast<long long>(blockIdx.x) * pieces;
    double a = 0.0, b = 0.0;
    for (int i = threadIdx.x; i < pieces; i += 32 * kWarps) {
        a += dy_partial[row + i];
        b += dx_partial[row + i];
    }
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) {
        a += __shfl_xor_sync(0xffffffffu, a, offset);
        b += __shfl_xor_sync(0xffffffffu, b, offset);
    }
    if (threadIdx.x % 32 == 0) {
        warp_sums[0][threadIdx.x / 32] = a;
        warp_sums[1][threadIdx.x / 32] = b;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < kWarps; ++w) {  // (kWarps 1: the warp's own sums, as they were)
            a += warp_sums[0][w];
            b += warp_sums[1][w];
        }
        bias_grad[blockIdx.x] = from_float<T>(factor * static_cast<float>(a));
        conv_bias_grad[blockIdx.x] = from_float<T>(static_cast<float>(b));
    }
}

// (kWarps: 1 for the channels-last pass's few partials a channel, 8 for the one pass's rows)
template <class T, int kWarps = 1>
cudaError_t kept_sums_finish(const float* dy_partial, const float* dx_partial, float factor,
                             T* bias_grad, T* conv_bias_grad, int channels, long long pieces,
                             cudaStream_t stream) {
    if (channels <= 0) return cudaSuccess;
    if (pieces > kMaxInt32Count) return cudaErrorInvalidValue;
    kept_sums_finish_kernel<T, kWarps><<<channels, 32 * kWarps, 0, stream>>>(
        dy_partial, dx_partial, factor, bias_grad, conv_bias_grad, static_cast<int>(pieces));
    return cudaGetLastError();
}

}  // namespace

cudaError_t min_add_mul_kept_sums_finish_launch(const float* dy_partial,
                                                const float* dx_partial, float factor,
                                                float* bias_grad, float* conv_bias_grad,
                                                int channels, long long pieces,
                                                cudaStream_t stream) {
    return kept_sums_finish<float, 8>(dy_partial, dx_partial, factor, bias_grad,
                                      conv_bias_grad, channels, pieces, stream);
}

long long min_add_mul_backward_kept_channels_last_workspace_bytes(int batch, int channels,
                                                                 int pixels) {
    return 2ll * channels * batch * kept_pieces_image(pixels) * 4;  // (floats)
}

namespace {
// (dx_small: float's split, dx_channels_last then taking the big parts; else nullptr)
template <class T>
cudaError_t kept_channels_last(const T* dy, const uint8_t* halves, T* dx_channels_last,
                               T* dx_small, T* bias_grad, T* conv_bias_grad, int batch,
                               int channels, int pixels, float factor, float* workspace,
                               cudaStream_t stream) {
    if (channels <= 0) return cudaSuccess;
    const int pieces_image = kept_pieces_image(pixels);
    const long long pieces = static_cast<long long>(batch) * pieces_image;
    const long long channel_blocks = (channels + kVecTile - 1) / kVecTile;
    if (pieces > kMaxInt32Count || channel_blocks > kMaxGridYZ) return cudaErrorInvalidValue;
    float* dx_partial = workspace + channels * pieces;
    cudaError_t err = cudaSuccess;
    if (pieces > 0) {  // (an empty batch: the finish writes zero sums)
        constexpr int kQuadBytes = kQuad * static_cast<int>(sizeof(T));
        const bool quads_aligned = pixels % kQuad == 0 &&
                                   reinterpret_cast<uintptr_t>(dy) % kQuadBytes == 0 &&
                                   reinterpret_cast<uintptr_t>(halves) % kQuad == 0;
        const dim3 grid(static_cast<unsigned>(pieces), static_cast<unsigned>(channel_blocks));
        auto kernel = min_add_mul_backward_kept_channels_last_kernel<T, false>;
        if constexpr (std::is_same_v<T, float>)
            if (dx_small != nullptr)
                kernel = min_add_mul_backward_kept_channels_last_kernel<T, true>;
        kernel<<<grid, kKeptThreads, 0, stream>>>(dy, halves, dx_channels_last, dx_small,
                                                  workspace, dx_partial, channels, pixels,
                                                  pieces_image, factor, quads_aligned);
        err = cudaGetLastError();
        if (err != cudaSuccess) return err;
    }
    return kept_sums_finish<T>(workspace, dx_partial, factor, bias_grad, conv_bias_grad,
                               channels, pieces, stream);
}
}  // namespace

template <class T>
cudaError_t min_add_mul_backward_kept_channels_last_launch(const T* dy, const uint8_t* halves,
                                                           T* dx_channels_last, T* bias_grad,
                                                           T* conv_bias_grad, int batch,
                                                           int channels, int pixels, float factor,
                                                           float* workspace, cudaStream_t stream) {
    return kept_channels_last<T>(dy, halves, dx_channels_last, nullptr, bias_grad,
                                 conv_bias_grad, batch, channels, pixels, factor, workspace,
                                 stream);
}

cudaError_t min_add_mul_backward_kept_split_launch(const float* dy, const uint8_t* halves,
                                                   float* big, float* small, float* bias_grad,
                                                   float* conv_bias_grad, int batch,
                                                   int channels, int pixels, float factor,
                                                   float* workspace, cudaStream_t stream) {
    return kept_channels_last<float>(dy, halves, big, small, bias_grad, conv_bias_grad, batch,
                                     channels, pixels, factor, workspace, stream);
}

#define X(T)                                                                                   \
    template cudaError_t min_add_mul_backward_kept_channels_last_launch<T>(                   \
        const T*, const uint8_t*, T*, T*, T*, int, int, int, float, float*, cudaStream_t);
SCRATCHOPS_FOR_EACH_ELEMENT(X)
#undef X

}  // namespace scratchops
