/* sched_csv.c: schedules as CSV files: one row per rank, one action per
 * cell, an empty cell is idle. Reads our notation and both of PyTorch's
 * (detected per file), writes ours or PyTorch's newer one. A full backward
 * (PyTorch's B where the file has I, BW in its older notation) is a BW.
 * PyTorch's compound cell "(0F4;7B0)OVERLAP_F_B" is an overlapped pair
 * (sched_plan.overlap), read and written as one cell.
 *
 * Reading goes in steps: find the rows, split them into cells (a reader),
 * tell the notation, put each cell's action on its rank's list and in the
 * grid (an expansion), then make the plan. */
#include "sched/sched.h"
#include "sched/sched_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"

/* A file has at most as many rows (ranks) as a generated schedule has
 * ranks (--pp); stages and microbatches at most CSV_MAX_INDEX + 1, the
 * microbatches pprun run takes (its stages are bounded further below). */
#define CSV_MAX_RANKS PP_SHAPE_MAX_RANKS
#define CSV_MAX_INDEX (PP_SHAPE_MAX_MICROBATCHES - 1)
/* The file is read whole: 64 MiB holds millions of actions, far past any
 * real schedule, and keeps /dev/zero or a huge file named by mistake out. */
#define SCHED_CSV_MAX_BYTES ((size_t)64 << 20)

/* Raw op letters as written in a file, before the notation is known. */
enum { RAW_F, RAW_I, RAW_B, RAW_W, RAW_BW };

typedef struct cell {
    int row, slot; /* rank, and grid column as in the file */
    int stage, raw, mb;
    int overlap; /* the first half (the F) of an OVERLAP_F_B cell's pair */
} cell;

typedef struct reader {
    const char *what;
    char *cellbuf; /* one cell's text, unquoted (owned; room for the whole file) */
    int line, col; /* where the cell being read is; its row is line - 1 */
    cell *cells;   /* owned */
    int n, cap;
    int row_slots;  /* slots used so far on the current row */
    int *row_width; /* [rows]: the slots each row takes, before expansion (owned) */
    int rows, row_cap;
} reader;

static int add_cell(reader *rd, int stage, int raw, int mb, pp_err *err) {
    if (rd->n == rd->cap) {
        int cap = rd->cap ? rd->cap * 2 : 256;
        cell *c = realloc(rd->cells, sizeof *c * (size_t)cap);
        if (!c) return pp_fail(err, "%s: out of memory", rd->what);
        rd->cells = c;
        rd->cap = cap;
    }
    rd->cells[rd->n++] = (cell){rd->line - 1, rd->row_slots++, stage, raw, mb, 0};
    return 0;
}

/* One action token: {stage}{F|I|B|W|BW}{mb}. Returns 1 when it is one of
 * PyTorch's communication or resharding actions (no cell for us), 0 for
 * a compute action, -1 when it is not an action, -2 when it is one whose
 * stage or microbatch is over CSV_MAX_INDEX. */
static int parse_token(const char *t, int *stage, int *raw, int *mb) {
    static const char *const comm_ops[] = {"SEND_F", "RECV_F", "SEND_B", "RECV_B", "UNSHARD", "RESHARD", "REDUCE_GRAD"};
    const char *p = t;
    long s = 0, b = 0;
    int big = 0; /* saturate rather than stop, so the rest of the token is still checked */
    if (*p < '0' || *p > '9') return -1;
    while (*p >= '0' && *p <= '9')
        if ((s = s * 10 + (*p++ - '0')) > CSV_MAX_INDEX) s = CSV_MAX_INDEX + 1, big = 1;
    for (size_t i = 0; i < sizeof comm_ops / sizeof comm_ops[0]; i++) {
        size_t n = strlen(comm_ops[i]);
        if (strncmp(p, comm_ops[i], n) == 0) {
            const char *q = p + n;
            while (*q >= '0' && *q <= '9') q++;
            return *q ? -1 : 1;
        }
    }
    if (p[0] == 'B' && p[1] == 'W') *raw = RAW_BW, p += 2;
    else if (*p == 'F') *raw = RAW_F, p++;
    else if (*p == 'I') *raw = RAW_I, p++;
    else if (*p == 'B') *raw = RAW_B, p++;
    else if (*p == 'W') *raw = RAW_W, p++;
    else return -1;
    if (*p < '0' || *p > '9') return -1;
    while (*p >= '0' && *p <= '9')
        if ((b = b * 10 + (*p++ - '0')) > CSV_MAX_INDEX) b = CSV_MAX_INDEX + 1, big = 1;
    if (*p) return -1;
    if (big) return -2;
    *stage = (int)s;
    *mb = (int)b;
    return 0;
}

static int bad_cell(const reader *rd, const char *text, int kind, pp_err *err) {
    if (kind == -2)
        return pp_fail(err, "%s: line %d, column %d: cell '%.60s': a stage or microbatch over %d", rd->what, rd->line,
                       rd->col, text, CSV_MAX_INDEX);
    return pp_fail(err,
                   "%s: line %d, column %d: cell '%.60s' is not an action; expected {stage}{op}{microbatch} with op "
                   "F, B, W (pprun), I, W, B (PyTorch) or BW (older PyTorch), e.g. 0F3, or an empty cell for idle",
                   rd->what, rd->line, rd->col, text);
}

/* PyTorch's compound cell "(0F1;1B0)OVERLAP_F_B" (ov points at its
 * OVERLAP_F_B): a forward and a backward that run at the same time, an
 * overlapped pair (two cells of the grid, the F first whatever the file's
 * order; the validator checks the rest), or one after the other when both
 * are of one stage. Communication actions in it are
 * implied, as anywhere. */
static int read_overlap_cell(reader *rd, char *text, const char *ov, pp_err *err) {
    int stage, raw, mb, k;
    char *open = strchr(text, '('), *close = strrchr(text, ')');
    if (!open || !close || close < open || close > ov) return bad_cell(rd, text, -1, err);
    *close = '\0';
    int first = rd->n, line = rd->line, col = rd->col;
    char *save = NULL;
    for (char *t = strtok_r(open + 1, ";, ", &save); t; t = strtok_r(NULL, ";, ", &save)) {
        k = parse_token(t, &stage, &raw, &mb);
        if (k < 0) return bad_cell(rd, t, k, err);
        if (k == 0 && add_cell(rd, stage, raw, mb, err) != 0) return -1;
    }
    if (rd->n - first != 2)
        return pp_fail(err, "%s: line %d, column %d: an OVERLAP_F_B cell holds %d compute actions; expected two, "
                       "an F and a backward, e.g. (0F4;7B0)OVERLAP_F_B", rd->what, line, col, rd->n - first);
    cell *a = &rd->cells[first], *b = a + 1;
    if (a->raw != RAW_F && b->raw == RAW_F) { /* the F first; each keeps its grid column */
        cell t = *a;
        a->stage = b->stage, a->raw = b->raw, a->mb = b->mb;
        b->stage = t.stage, b->raw = t.raw, b->mb = t.mb;
    }
    /* Two ops of one stage cannot run at once (a stage runs one op at a
     * time): PyTorch's runtime runs a cell's halves in turn anyway, so such
     * a cell is its F and then its backward. */
    a->overlap = a->stage != b->stage;
    return 0;
}

/* One cell's text (unquoted, trimmed). */
static int read_cell(reader *rd, char *text, pp_err *err) {
    int stage, raw, mb, k;
    if (!*text) {
        rd->row_slots++;
        return 0;
    }
    char *ov = strstr(text, "OVERLAP_F_B");
    if (ov) return read_overlap_cell(rd, text, ov, err);
    k = parse_token(text, &stage, &raw, &mb);
    if (k < 0) return bad_cell(rd, text, k, err);
    if (k == 1) {
        rd->row_slots++;
        return 0;
    }
    return add_cell(rd, stage, raw, mb, err);
}

static void trim(char **s) {
    while (**s == ' ' || **s == '\t') (*s)++;
    size_t n = strlen(*s);
    while (n > 0 && ((*s)[n - 1] == ' ' || (*s)[n - 1] == '\t')) (*s)[--n] = '\0';
}

/* The part of text that holds rows, [*begin, *end): after a UTF-8 byte
 * order mark (spreadsheets write one), before trailing blank lines (not
 * ranks). A text file has no NUL byte: cells would end at it and silently
 * drop what follows. */
static int find_rows(const char *what, const char *text, size_t len, size_t *begin, size_t *end, pp_err *err) {
    *begin = *end = 0;
    const char *nul = memchr(text, '\0', len);
    if (nul) {
        int line = 1;
        for (const char *q = text; q < nul; q++) line += *q == '\n';
        return pp_fail(err, "%s: line %d: a NUL byte; expected a text file with one row per rank", what, line);
    }
    *begin = len >= 3 && memcmp(text, "\xef\xbb\xbf", 3) == 0 ? 3 : 0;
    *end = len;
    while (*end > *begin && (text[*end - 1] == '\n' || text[*end - 1] == '\r' || text[*end - 1] == ' ' ||
                             text[*end - 1] == '\t'))
        (*end)--;
    if (*end == *begin) return pp_fail(err, "%s: no rows; expected one row per rank with actions like 0F3", what);
    return 0;
}

/* A quoted cell from the opening quote at text[*i] to its closing one
 * ("" is a quote inside), appended to the cell's text at *n. */
static int scan_quoted(reader *rd, const char *text, size_t *i, size_t end, size_t *n, pp_err *err) {
    size_t k = *i + 1;
    for (;;) {
        if (k >= end)
            return pp_fail(err, "%s: line %d, column %d: unterminated quoted cell", rd->what, rd->line, rd->col);
        if (text[k] == '"') {
            if (k + 1 < end && text[k + 1] == '"') {
                rd->cellbuf[(*n)++] = '"';
                k += 2;
                continue;
            }
            *i = k + 1;
            return 0;
        }
        rd->cellbuf[(*n)++] = text[k++];
    }
}

/* The cell at text[*i], up to a ',' or the end of its line (where *i is
 * left), into rd->cellbuf: unquoted, then trimmed at *cell. After a quoted
 * cell only blanks may follow. */
static int scan_cell(reader *rd, const char *text, size_t *i, size_t end, char **cell, pp_err *err) {
    size_t n = 0;
    *cell = rd->cellbuf;
    int quoted = *i < end && text[*i] == '"';
    if (quoted && scan_quoted(rd, text, i, end, &n, err) != 0) return -1;
    while (*i < end && text[*i] != ',' && text[*i] != '\n' && text[*i] != '\r') {
        if (quoted && text[*i] != ' ' && text[*i] != '\t')
            return pp_fail(err, "%s: line %d, column %d: text after a quoted cell", rd->what, rd->line, rd->col);
        rd->cellbuf[n++] = text[(*i)++];
    }
    rd->cellbuf[n] = '\0';
    trim(cell);
    return 0;
}

/* The first cell of line rd->line opens its row: at most CSV_MAX_RANKS,
 * refused where the one too many is, before anything is sized by rows. */
static int open_row(reader *rd, pp_err *err) {
    if (rd->line <= rd->rows) return 0;
    if (rd->line > CSV_MAX_RANKS)
        return pp_fail(err, "%s: line %d: more than %d rows; a schedule has at most %d ranks, one row each", rd->what,
                       rd->line, CSV_MAX_RANKS, CSV_MAX_RANKS);
    if (rd->line > rd->row_cap) { /* doubling: one row at a time is quadratic */
        int cap = rd->row_cap ? 2 * rd->row_cap : 64;
        int *w = realloc(rd->row_width, sizeof(int) * (size_t)cap);
        if (!w) return pp_fail(err, "%s: out of memory", rd->what);
        rd->row_width = w;
        rd->row_cap = cap;
    }
    rd->row_width[rd->line - 1] = 0;
    rd->rows = rd->line;
    return 0;
}

/* Every cell of text[i, end), row by row: rd's cells, rows and widths. */
static int read_rows(reader *rd, const char *text, size_t i, size_t end, pp_err *err) {
    rd->line = rd->col = 1;
    for (;;) {
        char *cell;
        if (scan_cell(rd, text, &i, end, &cell, err) != 0 || open_row(rd, err) != 0 || read_cell(rd, cell, err) != 0)
            return -1;
        if (i < end && text[i] == ',') {
            i++;
            rd->col++;
            continue;
        }
        rd->row_width[rd->line - 1] = rd->row_slots; /* the row ends */
        if (i >= end) return 0;
        if (text[i] == '\r' && i + 1 < end && text[i + 1] == '\n') i++;
        i++;
        rd->line++;
        rd->col = 1;
        rd->row_slots = 0;
    }
}

/* Stages and microbatches: the highest numbers in the file, plus one. */
static int file_shape(const reader *rd, int *S, int *m, pp_err *err) {
    *S = *m = 0;
    for (int k = 0; k < rd->n; k++) {
        if (rd->cells[k].stage + 1 > *S) *S = rd->cells[k].stage + 1;
        if (rd->cells[k].mb + 1 > *m) *m = rd->cells[k].mb + 1;
    }
    if ((long)*S * *m * 3 > PP_SHAPE_MAX_ACTIONS)
        return pp_fail(err, "%s: %d stages x %d microbatches x 3 ops is over " PP_SHAPE_MAX_ACTIONS_TEXT " actions",
                       rd->what, *S, *m);
    if (*S > PP_SHAPE_MAX_STAGES)
        return pp_fail(err, "%s: %d stages: more than %d (%d ranks x %d chunks), the most pprun runs", rd->what, *S,
                       PP_SHAPE_MAX_STAGES, PP_SHAPE_MAX_RANKS, PP_SHAPE_MAX_VIRTUAL);
    return 0;
}

/* Which notation? A file with I is PyTorch's newer one (B = full
 * backward). Without I, a B and a W of the same (stage, mb) mean B is the
 * input gradient (ours, PyTorch's older one, where BW is full). A file
 * with only F and B has full backwards. *full_b: is a bare B a BW? */
static int bare_b_is_full(const reader *rd, int S, int m, int *full_b, pp_err *err) {
    int has_i = 0, split = 0;
    for (int k = 0; k < rd->n; k++) has_i |= rd->cells[k].raw == RAW_I;
    if (!has_i) {
        unsigned char *seen = calloc((size_t)S * (size_t)m, 1);
        if (!seen) return pp_fail(err, "%s: out of memory", rd->what);
        for (int k = 0; k < rd->n; k++) {
            size_t key = (size_t)rd->cells[k].stage * (size_t)m + (size_t)rd->cells[k].mb;
            if (rd->cells[k].raw == RAW_B) seen[key] |= 1;
            if (rd->cells[k].raw == RAW_W) seen[key] |= 2;
        }
        for (size_t k = 0; k < (size_t)S * (size_t)m && !split; k++) split = seen[k] == 3;
        free(seen);
    }
    *full_b = has_i || !split;
    return 0;
}

/* The action a raw op stands for: a BW is a full backward, and so is a
 * bare B in a file whose B are full. */
static int cell_op(int raw, int full_b) {
    static const int ops[] = {[RAW_F] = SCHED_F, [RAW_I] = SCHED_B, [RAW_B] = SCHED_B, [RAW_W] = SCHED_W,
                              [RAW_BW] = SCHED_BW};
    return raw == RAW_B && full_b ? SCHED_BW : ops[raw];
}

/* The file's schedule as per-rank lists and its grid, before it is a plan.
 * Owns every array (expansion_free). */
typedef struct expansion {
    int p, S, v, m, full_b;
    int *lens;            /* [p]: actions in each list */
    sched_action **lists; /* [p][lens[r]]: each rank's actions in order */
    unsigned char **overlap; /* [p][lens[r]]: an OVERLAP_F_B pair's first half */
    int any_overlap;
    int *stage_rank;      /* [S] */
    sched_action **slots; /* [p][nslots]: the file's grid, idle cells stage -1 */
    int nslots, used;     /* used: the grid's width up to its last action */
} expansion;

static void expansion_free(expansion *ex) {
    for (int r = 0; r < ex->p; r++) {
        if (ex->lists) free(ex->lists[r]);
        if (ex->overlap) free(ex->overlap[r]);
        if (ex->slots) free(ex->slots[r]);
    }
    free(ex->lists);
    free(ex->overlap);
    free(ex->slots);
    free(ex->lens);
    free(ex->stage_rank);
}

/* Room for each rank's list: its own cells, one action each (one list of
 * every cell per rank would be ranks x cells). A blank line inside the
 * file would be a rank that runs nothing: refused. */
static int alloc_lists(const reader *rd, expansion *ex, pp_err *err) {
    ex->lens = calloc((size_t)ex->p, sizeof(int));
    ex->stage_rank = malloc(sizeof(int) * (size_t)ex->S);
    ex->lists = calloc((size_t)ex->p, sizeof *ex->lists);
    ex->overlap = calloc((size_t)ex->p, sizeof *ex->overlap);
    if (!ex->lens || !ex->stage_rank || !ex->lists || !ex->overlap) return pp_fail(err, "%s: out of memory", rd->what);
    for (int k = 0; k < rd->n; k++) ex->lens[rd->cells[k].row]++;
    for (int r = 0; r < ex->p; r++)
        if (!ex->lens[r])
            return pp_fail(err, "%s: line %d: no actions; every row is a rank and needs at least one action", rd->what,
                           r + 1);
    for (int r = 0; r < ex->p; r++) {
        if (!(ex->lists[r] = malloc(sizeof(sched_action) * (size_t)ex->lens[r])) ||
            !(ex->overlap[r] = malloc((size_t)ex->lens[r])))
            return pp_fail(err, "%s: out of memory", rd->what);
        ex->lens[r] = 0;
    }
    return 0;
}

/* The grid, every cell idle: as wide as the widest row. */
static int alloc_grid(const reader *rd, expansion *ex, pp_err *err) {
    ex->nslots = 0;
    int widest = 0;
    for (int r = 0; r < ex->p; r++)
        if (rd->row_width[r] > ex->nslots) ex->nslots = rd->row_width[r], widest = r;
    /* every row is as wide as the widest: bounded before it is made (a
     * line of 300,000 commas among 1,024 rows asked for 6 GB) */
    if ((long long)ex->p * ex->nslots > PP_SHAPE_MAX_GRID_CELLS)
        return pp_fail(err, "%s: line %d is %d cells wide, and every one of the %d rows is as wide as the widest: "
                            "%lld cells, more than " PP_SHAPE_MAX_GRID_CELLS_TEXT,
                       rd->what, widest + 1, ex->nslots, ex->p, (long long)ex->p * ex->nslots);
    if (!(ex->slots = calloc((size_t)ex->p, sizeof *ex->slots))) return pp_fail(err, "%s: out of memory", rd->what);
    size_t width = ex->nslots > 0 ? (size_t)ex->nslots : 1;
    for (int r = 0; r < ex->p; r++) {
        if (!(ex->slots[r] = calloc(width, sizeof(sched_action))))
            return pp_fail(err, "%s: out of memory", rd->what);
        for (int c = 0; c < ex->nslots; c++) ex->slots[r][c] = (sched_action){-1, 0, 0};
    }
    return 0;
}

/* A stage lives on the rank that runs most of its actions (the first such
 * rank on a tie); the validator then names any stray action elsewhere. */
static int place_stages(const reader *rd, expansion *ex, pp_err *err) {
    size_t p = (size_t)ex->p;
    int *count = calloc((size_t)ex->S * p, sizeof(int));
    if (!count) return pp_fail(err, "%s: out of memory", rd->what);
    for (int k = 0; k < rd->n; k++) count[(size_t)rd->cells[k].stage * p + (size_t)rd->cells[k].row]++;
    for (int s = 0; s < ex->S; s++) {
        const int *of_s = &count[(size_t)s * p];
        ex->stage_rank[s] = -1;
        for (int r = 0; r < ex->p; r++)
            if (of_s[r] > 0 && (ex->stage_rank[s] < 0 || of_s[r] > of_s[ex->stage_rank[s]])) ex->stage_rank[s] = r;
    }
    free(count);
    return 0;
}

/* Each cell's action onto its rank's list and into the grid at its slot. */
static void fill(const reader *rd, expansion *ex) {
    ex->used = 0;
    for (int k = 0; k < rd->n; k++) {
        const cell *c = &rd->cells[k];
        sched_action a = {c->stage, cell_op(c->raw, ex->full_b), c->mb};
        if (c->overlap) ex->any_overlap = 1;
        ex->overlap[c->row][ex->lens[c->row]] = (unsigned char)c->overlap;
        ex->lists[c->row][ex->lens[c->row]++] = a;
        ex->slots[c->row][c->slot] = a;
        if (c->slot + 1 > ex->used) ex->used = c->slot + 1;
    }
}

/* The plan of the expansion, with the file's own grid (its idle cells
 * included) in place of the simulated one; the grid's rows move into it. */
static int make_plan(const char *what, expansion *ex, sched_plan **out, pp_err *err) {
    char name[64];
    snprintf(name, sizeof name, "csv:%s", what);
    sched_plan *plan;
    if (sched_plan_from_lists_ov(name, ex->p, ex->S, ex->v, ex->m, ex->stage_rank, ex->lists, ex->lens,
                                 ex->any_overlap ? (const unsigned char *const *)ex->overlap : NULL, &plan, err) != 0)
        return -1;
    for (int r = 0; r < ex->p; r++) {
        free(plan->slots[r]);
        plan->slots[r] = ex->slots[r];
        ex->slots[r] = NULL;
    }
    plan->nslots = ex->used;
    *out = plan;
    return 0;
}

/* The steps of sched_parse_csv; rd and ex keep what they allocate. */
static int parse(reader *rd, expansion *ex, const char *text, size_t len, sched_plan **out, pp_err *err) {
    size_t begin, end;
    if (find_rows(rd->what, text, len, &begin, &end, err) != 0 || read_rows(rd, text, begin, end, err) != 0) return -1;
    if (rd->n == 0) return pp_fail(err, "%s: no actions in %d rows; expected actions like 0F3", rd->what, rd->rows);
    ex->p = rd->rows;
    if (file_shape(rd, &ex->S, &ex->m, err) != 0 || bare_b_is_full(rd, ex->S, ex->m, &ex->full_b, err) != 0)
        return -1;
    ex->v = (ex->S + ex->p - 1) / ex->p;
    if (alloc_lists(rd, ex, err) != 0 || alloc_grid(rd, ex, err) != 0 || place_stages(rd, ex, err) != 0) return -1;
    fill(rd, ex);
    return make_plan(rd->what, ex, out, err);
}

int sched_parse_csv(const char *text, size_t len, const char *what, sched_plan **out, pp_err *err) {
    *out = NULL;
    reader rd = {.what = what, .cellbuf = malloc(len + 1)};
    if (!rd.cellbuf) return pp_fail(err, "%s: out of memory", what);
    expansion ex = {0};
    int rc = parse(&rd, &ex, text, len, out, err);
    expansion_free(&ex);
    free(rd.cells);
    free(rd.row_width);
    free(rd.cellbuf);
    return rc;
}

int sched_load_csv(const char *path, sched_plan **out, pp_err *err) {
    *out = NULL;
    char *buf;
    size_t len;
    if (file_input_read(path, "schedule CSV", SCHED_CSV_MAX_BYTES, &buf, &len, err) != 0) return -1;
    int rc = sched_parse_csv(buf, len, path, out, err);
    free(buf);
    return rc;
}

int sched_write_csv(const sched_plan *plan, const char *path, const char *notation, pp_err *err) {
    int torch = 0;
    if (!notation || strcmp(notation, "pprun") == 0) torch = 0;
    else if (strcmp(notation, "pytorch") == 0) torch = 1;
    else return pp_fail(err, "--notation: unknown notation '%s'; accepted: pprun, pytorch", notation);
    file_output out;
    if (file_output_begin(&out, path, "schedule CSV", 0, err) != 0) return -1;
    static const char *const ours[] = {"F", "B", "W", "BW"}, *const theirs[] = {"F", "I", "W", "B"};
    const char *const *ops = torch ? theirs : ours;
    for (int r = 0; r < plan->ranks; r++) {
        /* trailing idle cells are left out: a row ends with its last action */
        int last = plan->nslots - 1;
        while (last >= 0 && plan->slots[r][last].stage < 0) last--;
        for (int c = 0, k = 0; c <= last; c++) { /* k: the row's actions so far (the grid's non-idle cells) */
            const sched_action *a = &plan->slots[r][c];
            if (c) fputc(',', out.f);
            if (a->stage < 0) continue;
            int pair = sched_overlaps(plan, r, k++) ? c + 1 : -1; /* the pair's second half: the row's next action */
            while (pair >= 0 && pair <= last && plan->slots[r][pair].stage < 0) pair++;
            if (pair < 0 || pair > last) {
                fprintf(out.f, "%d%s%d", a->stage, ops[a->op], a->mb);
                continue;
            }
            const sched_action *b = &plan->slots[r][pair];
            fprintf(out.f, "(%d%s%d;%d%s%d)OVERLAP_F_B", a->stage, ops[a->op], a->mb, b->stage, ops[b->op], b->mb);
            c = pair, k++; /* one cell for both: the file's grid is PyTorch's, a pair a step */
        }
        fputc('\n', out.f);
    }
    return file_output_commit(&out, err);
}
