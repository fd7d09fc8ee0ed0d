/* A fake libcudnn for CPU tests of convbench.algos.cudnn_find: the legacy convolution API's
 * signatures, with "device" pointers that are host pointers. It checks what it is given (shapes
 * that agree, cross-correlation, float data), answers a find with canned entries, and computes
 * each pass naively from the descriptors' strides, so a test can compare its output with the
 * float64 reference: every argument convbench marshals is used. Status codes are cuDNN 9's. */
#include <stdlib.h>
#include <string.h>
#include <stddef.h>

enum { OK = 0, BAD_PARAM = 2000, NOT_SUPPORTED = 3000, EXECUTION_FAILED = 5000 };

typedef struct { int dtype, n, c, h, w, sn, sc, sh, sw; } Tensor;
typedef struct { int dtype, format, k, c, r, s; } Filter;
typedef struct { int ph, pw, u, v, dh, dw, mode, compute, groups, math; } Conv;
typedef struct { int algo, status; float time; size_t memory; int determinism, mathType;
                 int reserved[3]; } Perf;

static int live = 0;
int fake_live_descriptors(void) { return live; }
static void *last_stream = 0;
void *fake_last_stream(void) { return last_stream; }
/* What the last convolution call ran: its algorithm, workspace pointer and size, math type. */
static int last_algo = -1, last_math = -1;
static void *last_ws = 0;
static size_t last_wss = 0;
int fake_last_algo(void) { return last_algo; }
int fake_last_math(void) { return last_math; }
void *fake_last_workspace(void) { return last_ws; }
size_t fake_last_workspace_size(void) { return last_wss; }
static void ran(int algo, const void *c_math, void *ws, size_t wss) {
    last_algo = algo; last_math = *(const int *)c_math; last_ws = ws; last_wss = wss;
}

const char *cudnnGetErrorString(int s) {
    switch (s) {
    case OK: return "CUDNN_STATUS_SUCCESS";
    case BAD_PARAM: return "CUDNN_STATUS_BAD_PARAM";
    case NOT_SUPPORTED: return "CUDNN_STATUS_NOT_SUPPORTED";
    case EXECUTION_FAILED: return "CUDNN_STATUS_EXECUTION_FAILED";
    default: return "CUDNN_STATUS_UNKNOWN";
    }
}
size_t cudnnGetVersion(void) { return 90100; }
int cudnnCreate(void **h) { *h = malloc(1); return OK; }
int cudnnDestroy(void *h) { free(h); return OK; }
int cudnnSetStream(void *h, void *s) { (void)h; last_stream = s; return OK; }

#define CREATE(Kind, Type) \
    int cudnnCreate##Kind##Descriptor(void **d) { *d = calloc(1, sizeof(Type)); live++; return OK; } \
    int cudnnDestroy##Kind##Descriptor(void *d) { free(d); live--; return OK; }
CREATE(Tensor, Tensor)
CREATE(Filter, Filter)
CREATE(Convolution, Conv)

int cudnnSetTensor4dDescriptorEx(Tensor *t, int dtype, int n, int c, int h, int w, int sn,
                                 int sc, int sh, int sw) {
    if (n <= 0 || c <= 0 || h <= 0 || w <= 0) return BAD_PARAM;
    *t = (Tensor){dtype, n, c, h, w, sn, sc, sh, sw};
    return OK;
}
int cudnnSetFilter4dDescriptor(Filter *f, int dtype, int format, int k, int c, int r, int s) {
    if (format != 0 && format != 1) return BAD_PARAM;
    *f = (Filter){dtype, format, k, c, r, s};
    return OK;
}
int cudnnSetConvolution2dDescriptor(Conv *c, int ph, int pw, int u, int v, int dh, int dw,
                                    int mode, int compute) {
    if (mode != 1 || u <= 0 || v <= 0 || dh <= 0 || dw <= 0) return BAD_PARAM;
    *c = (Conv){ph, pw, u, v, dh, dw, mode, compute, 1, 0};
    return OK;
}
int cudnnSetConvolutionGroupCount(Conv *c, int g) { if (g <= 0) return BAD_PARAM; c->groups = g; return OK; }
int cudnnSetConvolutionMathType(Conv *c, int m) { if (m < 0 || m > 3) return BAD_PARAM; c->math = m; return OK; }
int cudnnGetConvolutionForwardAlgorithmMaxCount(void *h, int *n) { (void)h; *n = 8; return OK; }
int cudnnGetConvolutionBackwardDataAlgorithmMaxCount(void *h, int *n) { (void)h; *n = 6; return OK; }
int cudnnGetConvolutionBackwardFilterAlgorithmMaxCount(void *h, int *n) { (void)h; *n = 7; return OK; }

/* x, w, y must agree (y's size from x, w and the convolution; channels per group). */
static int agree(const Tensor *x, const Filter *w, const Tensor *y, const Conv *c) {
    int oh = (x->h + 2 * c->ph - c->dh * (w->r - 1) - 1) / c->u + 1;
    int ow = (x->w + 2 * c->pw - c->dw * (w->s - 1) - 1) / c->v + 1;
    if (x->dtype != 0 || w->dtype != 0 || y->dtype != 0) return NOT_SUPPORTED;
    if (y->n != x->n || y->c != w->k || y->h != oh || y->w != ow) return BAD_PARAM;
    if (x->c != w->c * c->groups || w->k % c->groups) return BAD_PARAM;
    return OK;
}

/* Canned find answers per pass: (algo, status, time, memory, deterministic); math is the
 * descriptor's, except one tensor-op entry that an fp32 run must not choose. */
static const Perf FWD[] = {{1, OK, 0.5f, 0, 1, -1, {0}}, {1, OK, 0.1f, 0, 1, 1, {0}},
                           {0, OK, 0.75f, 1024, 1, -1, {0}}, {4, OK, 0.6f, 1 << 20, 1, -1, {0}},
                           {7, OK, 0.9f, 4096, 1, -1, {0}},
                           {6, NOT_SUPPORTED, -1.0f, 0, 1, -1, {0}}};
static const Perf BWD_DATA[] = {{0, OK, 0.3f, 0, 0, -1, {0}}, {1, OK, 0.4f, 0, 1, -1, {0}},
                                {4, NOT_SUPPORTED, -1.0f, 0, 1, -1, {0}}};
static const Perf BWD_FILTER[] = {{3, OK, 0.2f, 512, 0, -1, {0}}, {1, OK, 0.5f, 0, 1, -1, {0}},
                                  {0, OK, 0.6f, 0, 0, -1, {0}}};

static int answer(const Perf *canned, int count, const Conv *c, int requested, int *returned,
                  Perf *perf) {
    int n = count < requested ? count : requested;
    for (int i = 0; i < n; i++) {
        perf[i] = canned[i];
        if (perf[i].mathType < 0) perf[i].mathType = c->math;
    }
    *returned = n;
    return OK;
}

#define X(t, n, ch, i, j) ((n) * (t)->sn + (ch) * (t)->sc + (i) * (t)->sh + (j) * (t)->sw)
static size_t W(const Filter *f, int k, int c, int r, int s) {
    return f->format == 0 ? (((size_t)k * f->c + c) * f->r + r) * f->s + s
                          : (((size_t)k * f->r + r) * f->s + s) * f->c + c;
}

/* Calls fn(xi, wi, yi) for every product term of the convolution (offsets into x, w, y). */
typedef void (*Term)(size_t, size_t, size_t, void *);
static void each_term(const Tensor *x, const Filter *w, const Tensor *y, const Conv *c, Term fn,
                      void *ctx) {
    int kg = w->k / c->groups;
    for (int n = 0; n < y->n; n++) for (int k = 0; k < y->c; k++) {
        int g = k / kg;
        for (int oh = 0; oh < y->h; oh++) for (int ow = 0; ow < y->w; ow++)
        for (int ci = 0; ci < w->c; ci++) for (int r = 0; r < w->r; r++) for (int s = 0; s < w->s; s++) {
            int ih = oh * c->u - c->ph + r * c->dh, iw = ow * c->v - c->pw + s * c->dw;
            if (ih < 0 || iw < 0 || ih >= x->h || iw >= x->w) continue;
            fn(X(x, n, g * w->c + ci, ih, iw), W(w, k, ci, r, s), X(y, n, k, oh, ow), ctx);
        }
    }
}

typedef struct { const float *a, *b; float *acc; int which; } Ctx;
static void fwd_term(size_t xi, size_t wi, size_t yi, void *p) {
    Ctx *c = p; c->acc[yi] += c->a[xi] * c->b[wi];
}
static void bwd_data_term(size_t xi, size_t wi, size_t yi, void *p) {
    Ctx *c = p; c->acc[xi] += c->a[yi] * c->b[wi];
}
static void bwd_filter_term(size_t xi, size_t wi, size_t yi, void *p) {
    Ctx *c = p; c->acc[wi] += c->a[xi] * c->b[yi];
}

static size_t tensor_size(const Tensor *t) { return (size_t)t->n * t->c * t->h * t->w; }
static size_t filter_size(const Filter *f) { return (size_t)f->k * f->c * f->r * f->s; }

/* Which algos run (those the find reports as OK); WINOGRAD_NONFUSED "faults". */
static int runnable(const Perf *canned, int count, int algo, size_t ws) {
    if (canned == FWD && algo == 7) return EXECUTION_FAILED;
    for (int i = 0; i < count; i++)
        if (canned[i].algo == algo && canned[i].status == OK)
            return ws >= canned[i].memory ? OK : BAD_PARAM;
    return NOT_SUPPORTED;
}

/* The workspace an algorithm needs: the find's canned memory, for the algorithms it runs. */
static int sized(const Perf *canned, int count, int algo, size_t *size) {
    for (int i = 0; i < count; i++)
        if (canned[i].algo == algo && canned[i].status == OK) { *size = canned[i].memory; return OK; }
    return NOT_SUPPORTED;
}

static int finish(float *out, const float *acc, size_t count, const float *alpha,
                  const float *beta) {
    for (size_t i = 0; i < count; i++) out[i] = *alpha * acc[i] + *beta * (*beta ? out[i] : 0);
    return OK;
}

#define N(a) ((int)(sizeof(a) / sizeof((a)[0])))

int cudnnFindConvolutionForwardAlgorithmEx(void *h, Tensor *xd, void *x, Filter *wd, void *w,
        Conv *c, Tensor *yd, void *y, int req, int *ret, Perf *perf, void *ws, size_t wss) {
    (void)h; (void)x; (void)w; (void)y; (void)ws; (void)wss;
    int st = agree(xd, wd, yd, c);
    return st ? st : answer(FWD, N(FWD), c, req, ret, perf);
}
int cudnnFindConvolutionBackwardDataAlgorithmEx(void *h, Filter *wd, void *w, Tensor *dyd,
        void *dy, Conv *c, Tensor *dxd, void *dx, int req, int *ret, Perf *perf, void *ws,
        size_t wss) {
    (void)h; (void)w; (void)dy; (void)dx; (void)ws; (void)wss;
    int st = agree(dxd, wd, dyd, c);
    return st ? st : answer(BWD_DATA, N(BWD_DATA), c, req, ret, perf);
}
int cudnnFindConvolutionBackwardFilterAlgorithmEx(void *h, Tensor *xd, void *x, Tensor *dyd,
        void *dy, Conv *c, Filter *dwd, void *dw, int req, int *ret, Perf *perf, void *ws,
        size_t wss) {
    (void)h; (void)x; (void)dy; (void)dw; (void)ws; (void)wss;
    int st = agree(xd, dwd, dyd, c);
    return st ? st : answer(BWD_FILTER, N(BWD_FILTER), c, req, ret, perf);
}

int cudnnGetConvolutionForwardWorkspaceSize(void *h, Tensor *xd, Filter *wd, Conv *c,
        Tensor *yd, int algo, size_t *size) {
    (void)h;
    int st = agree(xd, wd, yd, c);
    return st ? st : sized(FWD, N(FWD), algo, size);
}
int cudnnGetConvolutionBackwardDataWorkspaceSize(void *h, Filter *wd, Tensor *dyd, Conv *c,
        Tensor *dxd, int algo, size_t *size) {
    (void)h;
    int st = agree(dxd, wd, dyd, c);
    return st ? st : sized(BWD_DATA, N(BWD_DATA), algo, size);
}
int cudnnGetConvolutionBackwardFilterWorkspaceSize(void *h, Tensor *xd, Tensor *dyd, Conv *c,
        Filter *dwd, int algo, size_t *size) {
    (void)h;
    int st = agree(xd, dwd, dyd, c);
    return st ? st : sized(BWD_FILTER, N(BWD_FILTER), algo, size);
}

int cudnnConvolutionForward(void *h, const float *alpha, Tensor *xd, const float *x,
        Filter *wd, const float *w, Conv *c, int algo, void *ws, size_t wss,
        const float *beta, Tensor *yd, float *y) {
    (void)h;
    int st = agree(xd, wd, yd, c);
    if (!st) st = runnable(FWD, N(FWD), algo, wss);
    if (st) return st;
    ran(algo, &c->math, ws, wss);
    size_t count = tensor_size(yd);
    float *acc = calloc(count, sizeof(float));
    Ctx ctx = {x, w, acc, 0};
    each_term(xd, wd, yd, c, fwd_term, &ctx);
    /* acc is indexed by y's strides, which span exactly its elements */
    finish(y, acc, count, alpha, beta);
    free(acc);
    return OK;
}
int cudnnConvolutionBackwardData(void *h, const float *alpha, Filter *wd, const float *w,
        Tensor *dyd, const float *dy, Conv *c, int algo, void *ws, size_t wss,
        const float *beta, Tensor *dxd, float *dx) {
    (void)h;
    int st = agree(dxd, wd, dyd, c);
    if (!st) st = runnable(BWD_DATA, N(BWD_DATA), algo, wss);
    if (st) return st;
    ran(algo, &c->math, ws, wss);
    size_t count = tensor_size(dxd);
    float *acc = calloc(count, sizeof(float));
    Ctx ctx = {dy, w, acc, 0};
    each_term(dxd, wd, dyd, c, bwd_data_term, &ctx);
    finish(dx, acc, count, alpha, beta);
    free(acc);
    return OK;
}
int cudnnConvolutionBackwardFilter(void *h, const float *alpha, Tensor *xd, const float *x,
        Tensor *dyd, const float *dy, Conv *c, int algo, void *ws, size_t wss,
        const float *beta, Filter *dwd, float *dw) {
    (void)h;
    int st = agree(xd, dwd, dyd, c);
    if (!st) st = runnable(BWD_FILTER, N(BWD_FILTER), algo, wss);
    if (st) return st;
    ran(algo, &c->math, ws, wss);
    size_t count = filter_size(dwd);
    float *acc = calloc(count, sizeof(float));
    Ctx ctx = {x, dy, acc, 0};
    each_term(xd, dwd, dyd, c, bwd_filter_term, &ctx);
    finish(dw, acc, count, alpha, beta);
    free(acc);
    return OK;
}
