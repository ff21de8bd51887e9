/* check_jobspec.c - tests for spec/jobspec: a table of bad specs, each with
 * the HTTP status, error code and field path a client would see; good specs
 * (the examples/, defaults, every optimizer and source); the normalized JSON
 * and its round trip; and malformed input (truncation, mutation, depth, NUL). */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "../spec/jobspec.h"
#include "../common/size.h"
#include "../common/util.h"

#define CTX64 "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

/* Specs are written with ' for " to stay readable; q() swaps them. */
static char *q(const char *s) {
    char *out = xstrdup(s);
    for (char *p = out; *p; p++)
        if (*p == '\'') *p = '"';
    return out;
}

static int parse_q(const char *spec, jobspec *s, spec_error *e) {
    char *j = q(spec);
    int rc = jobspec_parse(j, strlen(j), s, e);
    free(j);
    return rc;
}

static void parse_ok(const char *spec, jobspec *s) {
    spec_error e;
    int rc = parse_q(spec, s, &e);
    ck_assert_msg(rc == 0, "expected success for %s\ngot %d %s %s: %s", spec, e.status, e.code,
                  e.field, e.message);
}

/* ---------------------------------------------------------------- building blocks */

#define OUT10 "{'type':'dense','units':10,'activation':'softmax'}"
#define MODEL "'model':{'layers':[" OUT10 "]}"
#define COMP "'compile':{'optimizer':'sgd','loss':'sparse_categorical_crossentropy'}"
#define DATA "'data':{'source':'fashion-mnist'}"
#define BASE MODEL "," COMP "," DATA
#define GOOD "{" BASE "}"
#define TOP(extra) "{" BASE "," extra "}"
#define LAYERS(ls) "{'model':{'layers':[" ls "]}," COMP "," DATA "}"
#define COMPILE(c) "{" MODEL ",'compile':" c "," DATA "}"
#define OPT(o) COMPILE("{'optimizer':" o ",'loss':'sparse_categorical_crossentropy'}")
#define WDATA(d) "{" MODEL "," COMP ",'data':" d "}"
/* synthetic binary: 10 features, one sigmoid output */
#define SYN_MODEL "'model':{'layers':[{'type':'dense','units':4,'activation':'relu'}," \
                  "{'type':'dense','units':1,'activation':'sigmoid'}]}"
#define SYN_COMP "'compile':{'optimizer':'sgd','loss':'binary_crossentropy'}"
#define SYN(extra) "{" SYN_MODEL "," SYN_COMP ",'data':{'source':'synthetic'}," extra "}"
#define SYN_LAYERS(ls, loss) "{'model':{'layers':[" ls "]},'compile':{'optimizer':'sgd','loss':'" \
                             loss "'},'data':{'source':'synthetic'}}"
#define CSV_MODEL "'model':{'layers':[{'type':'dense','units':3,'activation':'softmax'," \
                  "'input_shape':[4]}]}"
#define CSV(d) "{" CSV_MODEL "," COMP ",'data':" d "}"
#define A16 "aaaaaaaaaaaaaaaa"
/* Keras' Fashion-MNIST CNN: 28x28 -> conv 32 -> pool -> conv 64 -> pool -> 128 -> 10 */
#define CNN_LAYERS "{'type':'conv2d','filters':32,'kernel_size':3,'activation':'relu','input_shape':[28,28]}," \
                   "{'type':'max_pooling2d','pool_size':2},"                                              \
                   "{'type':'conv2d','filters':64,'kernel_size':[3,3],'activation':'relu'},"              \
                   "{'type':'batch_normalization'},"                                                      \
                   "{'type':'max_pooling2d'},{'type':'flatten'},"                                         \
                   "{'type':'dense','units':128,'activation':'relu'},{'type':'dropout','rate':0.5},"      \
                   "{'type':'dense','units':10,'activation':'softmax'}"

typedef struct bad_case {
    const char *spec;
    int status;
    const char *code;
    const char *field;
} bad_case;

static const bad_case BAD[] = {
    /* ---- 400 bad_json */
    {"", 400, "bad_json", ""},
    {"{", 400, "bad_json", ""},
    {"{'name':}", 400, "bad_json", ""},
    {"[1,2]", 400, "bad_json", ""},
    {"null", 400, "bad_json", ""},
    {"'a string'", 400, "bad_json", ""},
    {GOOD " x", 400, "bad_json", ""},
    {GOOD GOOD, 400, "bad_json", ""},
    {"{'name':'a','name':'b'}", 400, "bad_json", "name"},
    {"{'model':{'layers':[{'type':'dense','units':10,'units':10}]}}", 400, "bad_json",
     "model.layers[0].units"},
    {"{'name':'a\nb'}", 400, "bad_json", ""},
    {"{'name':'\xff'}", 400, "bad_json", ""},
    {"{'name':'\xc3('}", 400, "bad_json", ""},
    {"{'name':'a\\u0000b'}", 400, "bad_json", ""},
    {"{'priority':NaN}", 400, "bad_json", ""},
    /* ---- unknown fields */
    {TOP("'nmae':'x'"), 422, "unknown_field", "nmae"},
    {TOP("'team':'x'"), 422, "unknown_field", "team"},
    {LAYERS("{'type':'dense','unitz':10}"), 422, "unknown_field", "model.layers[0].unitz"},
    {LAYERS("{'type':'dense','units':8,'activation':'relu'},{'type':'dense','unitz':10}"), 422,
     "unknown_field", "model.layers[1].unitz"},
    {"{'model':{'layer':[]}," COMP "," DATA "}", 422, "unknown_field", "model.layer"},
    {LAYERS("{'type':'dropout','rate':0.5,'units':3}," OUT10), 422, "unknown_field",
     "model.layers[0].units"},
    {LAYERS("{'type':'flatten','units':3}," OUT10), 422, "unknown_field", "model.layers[0].units"},
    {LAYERS(OUT10 ",{'type':'activation','activation':'softmax','rate':0.1}"), 422,
     "unknown_field", "model.layers[1].rate"},
    {LAYERS("{'type':'dense','units':10,'activation':'softmax','seed':1}"), 422, "unknown_field",
     "model.layers[0].seed"},
    {COMPILE("{'optimiser':'sgd','loss':'mse'}"), 422, "unknown_field", "compile.optimiser"},
    {OPT("{'type':'sgd','rho':0.9}"), 422, "unknown_field", "compile.optimizer.rho"},
    {OPT("{'type':'adam','momentum':0.9}"), 422, "unknown_field", "compile.optimizer.momentum"},
    {OPT("{'type':'rmsprop','amsgrad':true}"), 422, "unknown_field", "compile.optimizer.amsgrad"},
    {OPT("{'type':'adagrad','beta_1':0.9}"), 422, "unknown_field", "compile.optimizer.beta_1"},
    {OPT("{'type':'sgd','lr':0.1}"), 422, "unknown_field", "compile.optimizer.lr"},
    {WDATA("{'source':'fashion-mnist','features':784}"), 422, "unknown_field", "data.features"},
    {WDATA("{'source':'fashion-mnist','header':true}"), 422, "unknown_field", "data.header"},
    {"{" SYN_MODEL "," SYN_COMP ",'data':{'source':'synthetic','path':'/x'}}", 422,
     "unknown_field", "data.path"},
    {"{" SYN_MODEL "," SYN_COMP ",'data':{'source':'synthetic','label_column':0}}", 422,
     "unknown_field", "data.label_column"},
    {WDATA("{'source':'fashion-mnist','sead':1}"), 422, "unknown_field", "data.sead"},
    {TOP("'fit':{'epoch':3}"), 422, "unknown_field", "fit.epoch"},
    {TOP("'strategy':{'type':'mirrored','communication':'ring'}"), 422, "unknown_field",
     "strategy.communication"},
    {TOP("'strategy':{'type':'multi_worker_mirrored','cross_device_ops':'nccl'}"), 422,
     "unknown_field", "strategy.cross_device_ops"},
    {TOP("'strategy':{'type':'default','communication':'auto'}"), 422, "unknown_field",
     "strategy.communication"},
    {TOP("'resources':{'gpus':2}"), 422, "unknown_field", "resources.gpus"},
    {TOP("'checkpoint':{'every':2}"), 422, "unknown_field", "checkpoint.every"},
    {"{'command':{'args':['x']}}", 422, "unknown_field", "command.args"},
    /* ---- wrong JSON types */
    {TOP("'name':5"), 422, "invalid_type", "name"},
    {TOP("'priority':'high'"), 422, "invalid_type", "priority"},
    {TOP("'priority':1.5"), 422, "invalid_type", "priority"},
    {TOP("'preemptible':'yes'"), 422, "invalid_type", "preemptible"},
    {TOP("'preemptible':1"), 422, "invalid_type", "preemptible"},
    {TOP("'queue_if_infeasible':null"), 422, "invalid_type", "queue_if_infeasible"},
    {TOP("'max_runtime_s':'1h'"), 422, "invalid_type", "max_runtime_s"},
    {"{'model':[]," COMP "," DATA "}", 422, "invalid_type", "model"},
    {"{'model':{'layers':{}}," COMP "," DATA "}", 422, "invalid_type", "model.layers"},
    {LAYERS("'dense'"), 422, "invalid_type", "model.layers[0]"},
    {LAYERS("{'type':'dense','units':'10'}"), 422, "invalid_type", "model.layers[0].units"},
    {LAYERS("{'type':'dense','units':10.5}"), 422, "invalid_type", "model.layers[0].units"},
    {LAYERS("{'type':7,'units':10}"), 422, "invalid_type", "model.layers[0].type"},
    {LAYERS("{'type':'dense','units':10,'activation':'softmax','use_bias':1}"), 422,
     "invalid_type", "model.layers[0].use_bias"},
    {LAYERS("{'type':'dense','units':10,'activation':'softmax','input_shape':784}"), 422,
     "invalid_type", "model.layers[0].input_shape"},
    {LAYERS("{'type':'dense','units':10,'activation':'softmax','input_shape':['784']}"), 422,
     "invalid_type", "model.layers[0].input_shape[0]"},
    {LAYERS("{'type':'dropout','rate':'half'}," OUT10), 422, "invalid_type",
     "model.layers[0].rate"},
    {OPT("5"), 422, "invalid_type", "compile.optimizer"},
    {OPT("['sgd']"), 422, "invalid_type", "compile.optimizer"},
    {OPT("{'type':'sgd','learning_rate':'0.1'}"), 422, "invalid_type",
     "compile.optimizer.learning_rate"},
    {OPT("{'type':'sgd','nesterov':'yes'}"), 422, "invalid_type", "compile.optimizer.nesterov"},
    {COMPILE("{'optimizer':'sgd','loss':5}"), 422, "invalid_type", "compile.loss"},
    {COMPILE("{'optimizer':'sgd','loss':'mse','metrics':'accuracy'}"), 422, "invalid_type",
     "compile.metrics"},
    {COMPILE("{'optimizer':'sgd','loss':'mse','metrics':[1]}"), 422, "invalid_type",
     "compile.metrics[0]"},
    {"{" MODEL "," COMP ",'data':'fashion-mnist'}", 422, "invalid_type", "data"},
    {WDATA("{'source':'fashion-mnist','validation_split':'0.1'}"), 422, "invalid_type",
     "data.validation_split"},
    {WDATA("{'source':'fashion-mnist','seed':'7'}"), 422, "invalid_type", "data.seed"},
    {CSV("{'source':'csv','path':'/d.csv','label_column':true}"), 422, "invalid_type",
     "data.label_column"},
    {TOP("'fit':{'epochs':2.5}"), 422, "invalid_type", "fit.epochs"},
    {TOP("'fit':{'steps_per_epoch':'10'}"), 422, "invalid_type", "fit.steps_per_epoch"},
    {TOP("'fit':{'gradient_accumulation_steps':'2'}"), 422, "invalid_type",
     "fit.gradient_accumulation_steps"},
    {TOP("'fit':{'gradient_accumulation_steps':1.5}"), 422, "invalid_type",
     "fit.gradient_accumulation_steps"},
    {TOP("'fit':{'gradient_accumulation_steps':null}"), 422, "invalid_type",
     "fit.gradient_accumulation_steps"},
    {TOP("'fit':[]"), 422, "invalid_type", "fit"},
    {TOP("'strategy':'mirrored'"), 422, "invalid_type", "strategy"},
    {TOP("'resources':{'workers':true}"), 422, "invalid_type", "resources.workers"},
    {TOP("'checkpoint':{'keep':'all'}"), 422, "invalid_type", "checkpoint.keep"},
    {"{'command':{'argv':'python3 train.py'}}", 422, "invalid_type", "command.argv"},
    {"{'command':{'argv':['python3',1]}}", 422, "invalid_type", "command.argv[1]"},
    {"{'command':{'argv':['python3'],'env':{'A':1}}}", 422, "invalid_type", "command.env.A"},
    {"{'command':{'argv':['python3'],'working_dir':7}}", 422, "invalid_type", "command.working_dir"},
    {"{'command':{'argv':['python3'],'env':['A=1']}}", 422, "invalid_type", "command.env"},
    {"{'command':['python3','train.py']}", 422, "invalid_type", "command"},
    /* ---- values out of range or not in the enum */
    {TOP("'name':''"), 422, "invalid_value", "name"},
    {TOP("'name':'my job'"), 422, "invalid_value", "name"},
    {TOP("'name':'" A16 A16 A16 A16 A16 A16 A16 A16 "'"), 422, "invalid_value", "name"},
    {TOP("'priority':-1"), 422, "invalid_value", "priority"},
    {TOP("'priority':1001"), 422, "invalid_value", "priority"},
    {TOP("'max_runtime_s':0"), 422, "invalid_value", "max_runtime_s"},
    {TOP("'max_runtime_s':31536001"), 422, "invalid_value", "max_runtime_s"},
    {TOP("'max_restarts':101"), 422, "invalid_value", "max_restarts"},
    {TOP("'priority':1e400"), 422, "invalid_type", "priority"},
    {"{'model':{'layers':[]}," COMP "," DATA "}", 422, "invalid_value", "model.layers"},
    {LAYERS("{'type':'dense','units':0}"), 422, "invalid_value", "model.layers[0].units"},
    {LAYERS("{'type':'dense','units':65537}"), 422, "invalid_value", "model.layers[0].units"},
    {LAYERS("{'type':'lstm','units':10}"), 422, "invalid_value", "model.layers[0].type"},
    {LAYERS("{'type':'dense','units':10,'activation':'gelu'}"), 422, "invalid_value",
     "model.layers[0].activation"},
    {LAYERS("{'type':'dense','units':10,'activation':'softmax','kernel_initializer':'ones'}"),
     422, "invalid_value", "model.layers[0].kernel_initializer"},
    {LAYERS("{'type':'dense','units':10,'activation':'softmax','bias_initializer':'he'}"), 422,
     "invalid_value", "model.layers[0].bias_initializer"},
    {LAYERS("{'type':'dropout','rate':1}," OUT10), 422, "invalid_value", "model.layers[0].rate"},
    {LAYERS("{'type':'dropout','rate':-0.1}," OUT10), 422, "invalid_value",
     "model.layers[0].rate"},
    {LAYERS("{'type':'dropout','rate':0.999999999}," OUT10), 422, "invalid_value",
     "model.layers[0].rate"},
    {LAYERS("{'type':'dropout','rate':0.1,'seed':-1}," OUT10), 422, "invalid_value",
     "model.layers[0].seed"},
    {LAYERS("{'type':'dense','units':10,'activation':'softmax','input_shape':[]}"), 422,
     "invalid_value", "model.layers[0].input_shape"},
    {LAYERS("{'type':'flatten','input_shape':[1,1,1,1,784]}," OUT10), 422, "invalid_value",
     "model.layers[0].input_shape"},
    {LAYERS("{'type':'dense','units':10,'activation':'softmax','input_shape':[0]}"), 422,
     "invalid_value", "model.layers[0].input_shape[0]"},
    {LAYERS("{'type':'activation','activation':'swish'}," OUT10), 422, "invalid_value",
     "model.layers[0].activation"},
    {OPT("'adadelta'"), 422, "invalid_value", "compile.optimizer"},
    {OPT("'SGD'"), 422, "invalid_value", "compile.optimizer"},
    {OPT("{'type':'nadam'}"), 422, "invalid_value", "compile.optimizer.type"},
    {OPT("{'type':'sgd','learning_rate':0}"), 422, "invalid_value",
     "compile.optimizer.learning_rate"},
    {OPT("{'type':'sgd','learning_rate':-0.1}"), 422, "invalid_value",
     "compile.optimizer.learning_rate"},
    {OPT("{'type':'sgd','learning_rate':1e-60}"), 422, "invalid_value",
     "compile.optimizer.learning_rate"},
    {OPT("{'type':'sgd','momentum':1}"), 422, "invalid_value", "compile.optimizer.momentum"},
    {OPT("{'type':'rmsprop','rho':1.5}"), 422, "invalid_value", "compile.optimizer.rho"},
    {OPT("{'type':'rmsprop','epsilon':0}"), 422, "invalid_value", "compile.optimizer.epsilon"},
    {OPT("{'type':'adam','beta_1':-0.5}"), 422, "invalid_value", "compile.optimizer.beta_1"},
    {OPT("{'type':'adam','beta_2':1.0}"), 422, "invalid_value", "compile.optimizer.beta_2"},
    {OPT("{'type':'adagrad','initial_accumulator_value':-1}"), 422, "invalid_value",
     "compile.optimizer.initial_accumulator_value"},
    {COMPILE("{'optimizer':'sgd','loss':'hinge'}"), 422, "invalid_value", "compile.loss"},
    {COMPILE("{'optimizer':'sgd','loss':'sparse_categorical_crossentropy','metrics':['mae']}"),
     422, "invalid_value", "compile.metrics[0]"},
    {WDATA("{'source':'cifar10'}"), 422, "invalid_value", "data.source"},
    {WDATA("{'source':'fashion-mnist','path':''}"), 422, "invalid_value", "data.path"},
    {WDATA("{'source':'fashion-mnist','validation_split':1}"), 422, "invalid_value",
     "data.validation_split"},
    {WDATA("{'source':'fashion-mnist','shuffle_buffer':-2}"), 422, "invalid_value",
     "data.shuffle_buffer"},
    {WDATA("{'source':'fashion-mnist','seed':-1}"), 422, "invalid_value", "data.seed"},
    {WDATA("{'source':'fashion-mnist','seed':1e300}"), 422, "invalid_value", "data.seed"},
    {WDATA("{'source':'fashion-mnist','limit':0}"), 422, "invalid_value", "data.limit"},
    {"{" SYN_MODEL "," SYN_COMP ",'data':{'source':'synthetic','examples':0}}", 422,
     "invalid_value", "data.examples"},
    {"{" SYN_MODEL "," SYN_COMP ",'data':{'source':'synthetic','features':0}}", 422,
     "invalid_value", "data.features"},
    {CSV("{'source':'csv','path':'/d.csv','label_column':70000}"), 422, "invalid_value",
     "data.label_column"},
    {TOP("'fit':{'epochs':0}"), 422, "invalid_value", "fit.epochs"},
    {TOP("'fit':{'epochs':100001}"), 422, "invalid_value", "fit.epochs"},
    {TOP("'fit':{'batch_size':0}"), 422, "invalid_value", "fit.batch_size"},
    {TOP("'fit':{'batch_size':65537}"), 422, "invalid_value", "fit.batch_size"},
    {TOP("'fit':{'steps_per_epoch':0}"), 422, "invalid_value", "fit.steps_per_epoch"},
    {TOP("'fit':{'gradient_accumulation_steps':0}"), 422, "invalid_value",
     "fit.gradient_accumulation_steps"},
    {TOP("'fit':{'gradient_accumulation_steps':-2}"), 422, "invalid_value",
     "fit.gradient_accumulation_steps"},
    {TOP("'fit':{'gradient_accumulation_steps':65537}"), 422, "invalid_value",
     "fit.gradient_accumulation_steps"},
    {TOP("'fit':{'gradient_accumulation_steps':33}"), 422, "invalid_value",
     "fit.gradient_accumulation_steps"},
    {TOP("'strategy':{'type':'multi_worker_mirrored'},'resources':{'workers':2,"
         "'devices_per_worker':2},'fit':{'batch_size':32,'gradient_accumulation_steps':9}"), 422,
     "invalid_value", "fit.gradient_accumulation_steps"},
    {TOP("'strategy':{'type':'horovod'}"), 422, "invalid_value", "strategy.type"},
    {TOP("'strategy':{'type':'multi_worker_mirrored','communication':'mpi'}"), 422,
     "invalid_value", "strategy.communication"},
    {TOP("'strategy':{'type':'mirrored','cross_device_ops':'allreduce'}"), 422, "invalid_value",
     "strategy.cross_device_ops"},
    {TOP("'strategy':{'type':'mirrored','scale_learning_rate':1}"), 422, "invalid_type",
     "strategy.scale_learning_rate"},
    {LAYERS("{'type':'dense','units':10,'activation':'softmax','kernel_regularizer':0.01}"), 422,
     "invalid_type", "model.layers[0].kernel_regularizer"},
    {LAYERS("{'type':'dense','units':10,'activation':'softmax','kernel_regularizer':{'l2':-1}}"), 422,
     "invalid_value", "model.layers[0].kernel_regularizer.l2"},
    {LAYERS("{'type':'dense','units':10,'activation':'softmax','kernel_regularizer':{'l1':2}}"), 422,
     "invalid_value", "model.layers[0].kernel_regularizer.l1"},
    {LAYERS("{'type':'dense','units':10,'activation':'softmax','kernel_regularizer':{'l3':0.1}}"), 422,
     "unknown_field", "model.layers[0].kernel_regularizer.l3"},
    {LAYERS("{'type':'dropout','rate':0.1,'kernel_regularizer':{'l2':0.1}}," OUT10), 422,
     "unknown_field", "model.layers[0].kernel_regularizer"},
    {TOP("'strategy':{'type':'multi_worker_mirrored'},'resources':{'workers':1025}"), 422,
     "invalid_value", "resources.workers"},
    {TOP("'strategy':{'type':'mirrored'},'resources':{'devices_per_worker':65}"), 422,
     "invalid_value", "resources.devices_per_worker"},
    {TOP("'resources':{'device':'tpu'}"), 422, "invalid_value", "resources.device"},
    {TOP("'strategy':{'type':'parameter_server'},'resources':{'ps':65}"), 422, "invalid_value",
     "resources.ps"},
    {TOP("'checkpoint':{'keep':0}"), 422, "invalid_value", "checkpoint.keep"},
    {TOP("'checkpoint':{'keep':101}"), 422, "invalid_value", "checkpoint.keep"},
    {TOP("'checkpoint':{'every_epochs':-1}"), 422, "invalid_value", "checkpoint.every_epochs"},
    {"{'command':{'argv':[]}}", 422, "invalid_value", "command.argv"},
    {"{'command':{'argv':['']}}", 422, "invalid_value", "command.argv[0]"},
    {"{'command':{'argv':['x'],'env':{'1A':'v'}}}", 422, "invalid_value", "command.env.1A"},
    {"{'command':{'argv':['x'],'env':{'TF_CONFIG':'{}'}}}", 422, "invalid_value",
     "command.env.TF_CONFIG"},
    {"{'command':{'argv':['x']}," MODEL "}", 422, "invalid_value", "model"},
    {"{'command':{'argv':['x']}," DATA "}", 422, "invalid_value", "data"},
    {"{'command':{'argv':['x'],'working_dir':'/srv/team'}}", 422, "invalid_value",
     "command.working_dir"},
    {"{'command':{'argv':['x'],'working_dir':'..'}}", 422, "invalid_value", "command.working_dir"},
    {"{'command':{'argv':['x'],'working_dir':'team/../../etc'}}", 422, "invalid_value",
     "command.working_dir"},
    {"{'command':{'argv':['x'],'working_dir':'a//..'}}", 422, "invalid_value",
     "command.working_dir"},
    {"{'command':{'argv':['x'],'working_dir':''}}", 422, "invalid_value", "command.working_dir"},
    {"{'command':{'argv':['x'],'env':{'RANK':'3'}}}", 422, "invalid_value", "command.env.RANK"},
    {"{'command':{'argv':['x'],'env':{'MASTER_PORT':'1'}}}", 422, "invalid_value",
     "command.env.MASTER_PORT"},
    {"{'command':{'argv':['x'],'env':{'CUDA_VISIBLE_DEVICES':'0'}}}", 422, "invalid_value",
     "command.env.CUDA_VISIBLE_DEVICES"},
    {"{'command':{'argv':['x'],'env':{'TRAINYARD_CHECKPOINT_DIR':'/tmp'}}}", 422,
     "invalid_value", "command.env.TRAINYARD_CHECKPOINT_DIR"},
    {"{'command':{'argv':['x'],'env':{'LOCAL_WORLD_SIZE':'1'}}}", 422, "invalid_value",
     "command.env.LOCAL_WORLD_SIZE"},
    {"{'command':{'argv':['x']},'strategy':{'type':'default'},'resources':{'workers':2}}", 422,
     "invalid_value", "resources.workers"},
    {"{'command':{'argv':['x']},'strategy':{'type':'parameter_server'}}", 422, "missing_field",
     "resources.ps"},
    /* ---- cross-field checks */
    {LAYERS("{'type':'dense','units':10,'activation':'softmax','input_shape':[100]}"), 422,
     "invalid_value", "model.layers[0].input_shape"},
    {LAYERS("{'type':'flatten','input_shape':[28,27]}," OUT10), 422, "invalid_value",
     "model.layers[0].input_shape"},
    {LAYERS("{'type':'dense','units':10,'activation':'softmax','input_shape':[28,28]}"), 422,
     "invalid_value", "model.layers[0].input_shape"},
    {LAYERS("{'type':'dropout','rate':0.1,'input_shape':[28,28]}," OUT10), 422, "invalid_value",
     "model.layers[1].type"},
    {LAYERS("{'type':'dense','units':8,'activation':'relu'},"
            "{'type':'dense','units':10,'activation':'softmax','input_shape':[8]}"),
     422, "invalid_value", "model.layers[1].input_shape"},
    {SYN_LAYERS("{'type':'dense','units':1,'activation':'sigmoid','input_shape':[784]}",
                "binary_crossentropy"), 422, "invalid_value", "model.layers[0].input_shape"},
    {"{'model':{'layers':[{'type':'dense','units':3,'activation':'softmax'}]}," COMP
     ",'data':{'source':'csv','path':'/d.csv'}}", 422, "missing_field",
     "model.layers[0].input_shape"},
    {LAYERS(OUT10 ",{'type':'dropout','rate':0.1}"), 422, "invalid_value", "model.layers[1].type"},
    {LAYERS("{'type':'dense','units':10},{'type':'dropout','rate':0.1},"
            "{'type':'activation','activation':'softmax'}"), 422, "invalid_value",
     "model.layers[2].type"},
    {LAYERS("{'type':'dense','units':10,'activation':'softmax'}," OUT10), 422, "invalid_value",
     "model.layers[0].activation"},
    {LAYERS("{'type':'dense','units':10,'activation':'softmax'},"
            "{'type':'activation','activation':'softmax'}"), 422, "invalid_value",
     "model.layers[0].activation"},
    {LAYERS("{'type':'dense','units':5,'activation':'softmax'}"), 422, "invalid_value",
     "model.layers[0].units"},
    {LAYERS("{'type':'dense','units':10,'activation':'relu'}"), 422, "invalid_value",
     "model.layers[0].activation"},
    {LAYERS("{'type':'dense','units':10},{'type':'activation','activation':'sigmoid'}"), 422,
     "invalid_value", "model.layers[1].activation"},
    {"{" MODEL ",'compile':{'optimizer':'sgd','loss':'binary_crossentropy'}," DATA "}", 422,
     "invalid_value", "compile.loss"},
    {SYN_LAYERS("{'type':'dense','units':2,'activation':'sigmoid'}", "binary_crossentropy"), 422,
     "invalid_value", "model.layers[0].units"},
    {SYN_LAYERS("{'type':'dense','units':1,'activation':'relu'}", "binary_crossentropy"), 422,
     "invalid_value", "model.layers[0].activation"},
    {SYN_LAYERS("{'type':'dense','units':1}", "binary_crossentropy"), 422, "invalid_value",
     "model.layers[0].activation"},
    {LAYERS("{'type':'dense','units':10,'activation':null}"), 422, "invalid_value",
     "model.layers[0].activation"},
    {SYN_LAYERS("{'type':'dense','units':3,'activation':'softmax'}", "categorical_crossentropy"),
     422, "invalid_value", "model.layers[0].units"},
    {"{'model':{'layers':[{'type':'dense','units':1,'activation':'softmax','input_shape':[4]}]},"
     "'compile':{'optimizer':'sgd','loss':'categorical_crossentropy'},"
     "'data':{'source':'csv','path':'/d.csv'}}", 422, "invalid_value", "model.layers[0].units"},
    {"{'model':{'layers':[{'type':'dense','units':3,'activation':'sigmoid','input_shape':[4]}]},"
     "'compile':{'optimizer':'sgd','loss':'categorical_crossentropy'},"
     "'data':{'source':'csv','path':'/d.csv'}}", 422, "invalid_value", "model.layers[0].activation"},
    {LAYERS("{'type':'dense','units':65536,'activation':'relu'},"
            "{'type':'dense','units':65536,'activation':'relu'}," OUT10), 422, "invalid_value",
     "model.layers[1].units"},
    {CSV("{'source':'csv','path':'/d.csv','label_column':'y','header':false}"), 422,
     "invalid_value", "data.label_column"},
    {SYN("'fit':{'batch_size':100,'steps_per_epoch':11}"), 422, "invalid_value",
     "fit.steps_per_epoch"},
    {"{" SYN_MODEL "," SYN_COMP ",'data':{'source':'synthetic','examples':100000000,"
     "'features':10}}", 422, "invalid_value", "data.examples"},
    {"{" SYN_MODEL "," SYN_COMP ",'data':{'source':'synthetic','limit':1,"
     "'validation_split':0.5}}", 422, "invalid_value", "data.validation_split"},
    {"{" SYN_MODEL "," SYN_COMP ",'data':{'source':'synthetic','examples':1},"
     "'strategy':{'type':'multi_worker_mirrored'},'resources':{'workers':2},'fit':{'batch_size':2}}",
     422, "invalid_value", "resources.workers"},
    {TOP("'resources':{'workers':2}"), 422, "invalid_value", "resources.workers"},
    {TOP("'strategy':{'type':'one_device'},'resources':{'devices_per_worker':2}"), 422,
     "invalid_value", "resources.devices_per_worker"},
    {TOP("'strategy':{'type':'mirrored'},'resources':{'workers':2}"), 422, "invalid_value",
     "resources.workers"},
    {TOP("'strategy':{'type':'central_storage'},'resources':{'workers':3}"), 422,
     "invalid_value", "resources.workers"},
    {TOP("'strategy':{'type':'mirrored'},'resources':{'ps':1}"), 422, "invalid_value",
     "resources.ps"},
    {TOP("'strategy':{'type':'multi_worker_mirrored','communication':'nccl'},"
         "'resources':{'workers':2,'device':'cpu'}"), 422, "invalid_value",
     "strategy.communication"},
    {TOP("'strategy':{'type':'mirrored','cross_device_ops':'nccl'},"
         "'resources':{'devices_per_worker':2}"), 422, "invalid_value",
     "strategy.cross_device_ops"},
    {TOP("'strategy':{'type':'multi_worker_mirrored'},'resources':{'workers':2,"
         "'devices_per_worker':2},'fit':{'batch_size':30}"), 422, "invalid_value",
     "fit.batch_size"},
    {TOP("'strategy':{'type':'parameter_server'},'resources':{'workers':3,'ps':1},"
         "'fit':{'batch_size':32}"), 422, "invalid_value", "fit.batch_size"},
    {TOP("'fit':{'batch_size':128,'steps_per_epoch':470}"), 422, "invalid_value",
     "fit.steps_per_epoch"},
    /* ---- required fields */
    {"{}", 422, "missing_field", "model"},
    {"{" COMP "," DATA "}", 422, "missing_field", "model"},
    {"{'model':{}," COMP "," DATA "}", 422, "missing_field", "model.layers"},
    {LAYERS("{'units':10}"), 422, "missing_field", "model.layers[0].type"},
    {LAYERS("{'type':'dense','activation':'softmax'}"), 422, "missing_field",
     "model.layers[0].units"},
    {LAYERS("{'type':'dropout'}," OUT10), 422, "missing_field", "model.layers[0].rate"},
    {LAYERS("{'type':'dense','units':10},{'type':'activation'}"), 422, "missing_field",
     "model.layers[1].activation"},
    {"{" MODEL "," DATA "}", 422, "missing_field", "compile"},
    {COMPILE("{'loss':'mse'}"), 422, "missing_field", "compile.optimizer"},
    {OPT("{'learning_rate':0.1}"), 422, "missing_field", "compile.optimizer.type"},
    {COMPILE("{'optimizer':'sgd'}"), 422, "missing_field", "compile.loss"},
    {"{" MODEL "," COMP "}", 422, "missing_field", "data"},
    {WDATA("{'validation_split':0.1}"), 422, "missing_field", "data.source"},
    {CSV("{'source':'csv'}"), 422, "missing_field", "data.path"},
    {WDATA("{'source':'mnist'}"), 422, "missing_field", "data.path"},
    {TOP("'strategy':{'type':'parameter_server'},'resources':{'workers':2}"), 422,
     "missing_field", "resources.ps"},
    {TOP("'strategy':{'type':'parameter_server'}"), 422, "missing_field", "resources.ps"},
    {"{'command':{}}", 422, "missing_field", "command.argv"},
    /* ---- not available here */
    {TOP("'strategy':{'type':'tpu'}"), 422, "unsupported", "strategy.type"},
    /* ---- resources.memory */
    {TOP("'resources':{'memory':-1}"), 422, "invalid_value", "resources.memory"},
    {TOP("'resources':{'memory':'-1GiB'}"), 422, "invalid_value", "resources.memory"},
    {TOP("'resources':{'memory':'GiB'}"), 422, "invalid_value", "resources.memory"},
    {TOP("'resources':{'memory':''}"), 422, "invalid_value", "resources.memory"},
    {TOP("'resources':{'memory':'1.GiB'}"), 422, "invalid_value", "resources.memory"},
    {TOP("'resources':{'memory':' 4GiB'}"), 422, "invalid_value", "resources.memory"},
    {TOP("'resources':{'memory':'4XB'}"), 422, "invalid_value", "resources.memory"},
    {TOP("'resources':{'memory':'4gib'}"), 422, "invalid_value", "resources.memory"},
    {TOP("'resources':{'memory':'4GiB '}"), 422, "invalid_value", "resources.memory"},
    {TOP("'resources':{'memory':'1.1234567891GiB'}"), 422, "invalid_value", "resources.memory"},
    {TOP("'resources':{'memory':'8MiB'}"), 422, "invalid_value", "resources.memory"},
    {TOP("'resources':{'memory':16777215}"), 422, "invalid_value", "resources.memory"},
    {TOP("'resources':{'memory':'16000K'}"), 422, "invalid_value", "resources.memory"},
    {TOP("'resources':{'memory':'65TiB'}"), 422, "invalid_value", "resources.memory"},
    {TOP("'resources':{'memory':'64.5TiB'}"), 422, "invalid_value", "resources.memory"},
    {TOP("'resources':{'memory':'99999999999999999999999999G'}"), 422, "invalid_value", "resources.memory"},
    {TOP("'resources':{'memory':70368744177665}"), 422, "invalid_value", "resources.memory"},
    {TOP("'resources':{'memory':true}"), 422, "invalid_type", "resources.memory"},
    {TOP("'resources':{'memory':null}"), 422, "invalid_type", "resources.memory"},
    {TOP("'resources':{'memory':[4]}"), 422, "invalid_type", "resources.memory"},
    {TOP("'resources':{'memory':{'gib':4}}"), 422, "invalid_type", "resources.memory"},
    {TOP("'resources':{'memory':20000000.5}"), 422, "invalid_type", "resources.memory"},
    {TOP("'resources':{'memroy':'4GiB'}"), 422, "unknown_field", "resources.memroy"},
    /* ---- convolutional layers: fields, then shapes (the field names the layer) */
    {LAYERS("{'type':'conv2d','kernel_size':3,'input_shape':[28,28]},{'type':'flatten'}," OUT10),
     422, "missing_field", "model.layers[0].filters"},
    {LAYERS("{'type':'conv2d','filters':8,'input_shape':[28,28]},{'type':'flatten'}," OUT10),
     422, "missing_field", "model.layers[0].kernel_size"},
    {LAYERS("{'type':'conv2d','filters':8,'kernel_size':[3],'input_shape':[28,28]}," OUT10),
     422, "invalid_value", "model.layers[0].kernel_size"},
    {LAYERS("{'type':'conv2d','filters':8,'kernel_size':0,'input_shape':[28,28]}," OUT10),
     422, "invalid_value", "model.layers[0].kernel_size"},
    {LAYERS("{'type':'conv2d','filters':8,'kernel_size':'3','input_shape':[28,28]}," OUT10),
     422, "invalid_type", "model.layers[0].kernel_size"},
    {LAYERS("{'type':'conv2d','filters':8,'kernel_size':3,'strides':[1,1.5],'input_shape':[28,28]}," OUT10),
     422, "invalid_type", "model.layers[0].strides"},
    {LAYERS("{'type':'conv2d','filters':8,'kernel_size':3,'padding':'full','input_shape':[28,28]}," OUT10),
     422, "invalid_value", "model.layers[0].padding"},
    {LAYERS("{'type':'conv2d','filters':8,'kernel_size':3,'dilation_rate':2,'input_shape':[28,28]}," OUT10),
     422, "unknown_field", "model.layers[0].dilation_rate"},
    {LAYERS("{'type':'max_pooling2d','pool_size':[2,2,2],'input_shape':[28,28]}," OUT10),
     422, "invalid_value", "model.layers[0].pool_size"},
    {LAYERS("{'type':'batch_normalization','momentum':1.5}," OUT10), 422, "invalid_value",
     "model.layers[0].momentum"},
    {LAYERS("{'type':'batch_normalization','epsilon':0}," OUT10), 422, "invalid_value",
     "model.layers[0].epsilon"},
    {LAYERS("{'type':'batch_normalization','center':1}," OUT10), 422, "invalid_type",
     "model.layers[0].center"},
    {LAYERS("{'type':'reshape'}," OUT10), 422, "missing_field", "model.layers[0].target_shape"},
    {LAYERS("{'type':'reshape','target_shape':[-1,-1]}," OUT10), 422, "invalid_value",
     "model.layers[0].target_shape[1]"},
    {LAYERS("{'type':'reshape','target_shape':[28,27]}," OUT10), 422, "invalid_value",
     "model.layers[0].target_shape"},
    {LAYERS("{'type':'reshape','target_shape':[-1,5]}," OUT10), 422, "invalid_value",
     "model.layers[0].target_shape"},
    /* a conv on a flat input; a kernel larger than its input; a pool that does not fit */
    {LAYERS("{'type':'conv2d','filters':8,'kernel_size':3},{'type':'flatten'}," OUT10), 422,
     "invalid_value", "model.layers[0]"},
    {LAYERS("{'type':'dense','units':64,'input_shape':[784]},{'type':'conv2d','filters':8,'kernel_size':3}," OUT10),
     422, "invalid_value", "model.layers[1]"},
    {LAYERS("{'type':'conv2d','filters':8,'kernel_size':29,'input_shape':[28,28]},{'type':'flatten'}," OUT10),
     422, "invalid_value", "model.layers[0]"},
    {LAYERS("{'type':'conv2d','filters':8,'kernel_size':3,'input_shape':[28,28]},"
            "{'type':'max_pooling2d','pool_size':13},{'type':'conv2d','filters':4,'kernel_size':3},"
            "{'type':'flatten'}," OUT10), 422, "invalid_value", "model.layers[2]"},
    {LAYERS("{'type':'global_average_pooling2d','input_shape':[784]}," OUT10), 422,
     "invalid_value", "model.layers[0]"},
    {LAYERS("{'type':'conv2d','filters':8,'kernel_size':3,'input_shape':[28,28]},"
            "{'type':'global_average_pooling2d'},{'type':'max_pooling2d'}," OUT10), 422,
     "invalid_value", "model.layers[2]"},
    {LAYERS("{'type':'conv2d','filters':8,'kernel_size':3,'input_shape':[28,28]}," OUT10), 422,
     "invalid_value", "model.layers[1].type"},
    {LAYERS("{'type':'conv2d','filters':8,'kernel_size':3,'activation':'softmax','input_shape':[28,28]},"
            "{'type':'flatten'}," OUT10), 422, "invalid_value", "model.layers[0].activation"},
    {LAYERS("{'type':'conv2d','filters':65536,'kernel_size':1,'input_shape':[28,28]},{'type':'flatten'}," OUT10),
     422, "invalid_value", "model.layers[0]"},
    /* 1000 x 1000 outputs of a 11 x 11 window: 121M values per example to multiply */
    {"{'model':{'layers':[{'type':'conv2d','filters':1,'kernel_size':11,'padding':'same','input_shape':[1000,1000,1]},"
     "{'type':'flatten'},{'type':'dense','units':2,'activation':'softmax'}]}," COMP ",'data':{'source':'synthetic',"
     "'features':1000000,'examples':100}}", 422, "invalid_value", "model.layers[0]"},
    /* ---- resources.evaluator */
    {TOP("'resources':{'evaluator':1}"), 422, "invalid_type", "resources.evaluator"},
    {TOP("'resources':{'evaluator':'yes'}"), 422, "invalid_type", "resources.evaluator"},
    {TOP("'resources':{'evaluator':null}"), 422, "invalid_type", "resources.evaluator"},
    {"{'command':{'argv':['x']},'resources':{'evaluator':[true]}}", 422, "invalid_type", "resources.evaluator"},
    /* ---- ports, interactive, idle_timeout */
#define CMD_PORTS(p) "{'command':{'argv':['x']},'ports':" p "}"
#define PORTS8 "{'name':'p0','port':1000},{'name':'p1','port':1001},{'name':'p2','port':1002}," \
               "{'name':'p3','port':1003},{'name':'p4','port':1004},{'name':'p5','port':1005}," \
               "{'name':'p6','port':1006},{'name':'p7','port':1007}"
    {CMD_PORTS("{'name':'tb','port':6006}"), 422, "invalid_type", "ports"},
    {CMD_PORTS("'tb'"), 422, "invalid_type", "ports"},
    {CMD_PORTS("[" PORTS8 ",{'name':'p8','port':1008}]"), 422, "invalid_value", "ports"},
    {CMD_PORTS("[6006]"), 422, "invalid_type", "ports[0]"},
    {CMD_PORTS("[{'name':'tb','port':6006},null]"), 422, "invalid_type", "ports[1]"},
    {CMD_PORTS("[{'port':6006}]"), 422, "missing_field", "ports[0].name"},
    {CMD_PORTS("[{'name':5,'port':6006}]"), 422, "invalid_type", "ports[0].name"},
    {CMD_PORTS("[{'name':'','port':6006}]"), 422, "invalid_value", "ports[0].name"},
    {CMD_PORTS("[{'name':'TensorBoard','port':6006}]"), 422, "invalid_value", "ports[0].name"},
    {CMD_PORTS("[{'name':'1tb','port':6006}]"), 422, "invalid_value", "ports[0].name"},
    {CMD_PORTS("[{'name':'-tb','port':6006}]"), 422, "invalid_value", "ports[0].name"},
    {CMD_PORTS("[{'name':'a/b','port':6006}]"), 422, "invalid_value", "ports[0].name"},
    {CMD_PORTS("[{'name':'a.b','port':6006}]"), 422, "invalid_value", "ports[0].name"},
    {CMD_PORTS("[{'name':'aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa','port':6006}]"), 422, "invalid_value", "ports[0].name"},
    {CMD_PORTS("[{'name':'tb','port':6006},{'name':'tb','port':6007}]"), 422, "invalid_value", "ports[1].name"},
    {CMD_PORTS("[{'name':'my-ui','port':6006},{'name':'my_ui','port':6007}]"), 422, "invalid_value", "ports[1].name"},
    {CMD_PORTS("[{'name':'tb'}]"), 422, "missing_field", "ports[0].port"},
    {CMD_PORTS("[{'name':'tb','port':6006},{'name':'ui','port':0}]"), 422, "invalid_value", "ports[1].port"},
    {CMD_PORTS("[{'name':'tb','port':65536}]"), 422, "invalid_value", "ports[0].port"},
    {CMD_PORTS("[{'name':'tb','port':-1}]"), 422, "invalid_value", "ports[0].port"},
    {CMD_PORTS("[{'name':'tb','port':'6006'}]"), 422, "invalid_type", "ports[0].port"},
    {CMD_PORTS("[{'name':'tb','port':60.5}]"), 422, "invalid_type", "ports[0].port"},
    {CMD_PORTS("[{'name':'tb','port':null}]"), 422, "invalid_type", "ports[0].port"},
    {CMD_PORTS("[{'name':'tb','port':6006,'host':'0.0.0.0'}]"), 422, "unknown_field", "ports[0].host"},
    {TOP("'ports':[{'name':'tb','port':70000}]"), 422, "invalid_value", "ports[0].port"},
    {"{'interactive':'notebook'}", 422, "invalid_type", "interactive"},
    {"{'interactive':{}}", 422, "missing_field", "interactive.type"},
    {"{'interactive':{'type':'lab'}}", 422, "invalid_value", "interactive.type"},
    {"{'interactive':{'type':1}}", 422, "invalid_type", "interactive.type"},
    {"{'interactive':{'type':'notebook','kernel':'python3'}}", 422, "unknown_field", "interactive.kernel"},
    {"{'interactive':{'type':'notebook','context':'sha256:abc'}}", 422, "invalid_value", "interactive.context"},
    {"{'interactive':{'type':'shell','context':7}}", 422, "invalid_type", "interactive.context"},
    {"{'interactive':{'type':'shell'},'command':{'argv':['x']}}", 422, "invalid_value", "command"},
    {TOP("'interactive':{'type':'notebook'}"), 422, "invalid_value", "model"},
    {"{'interactive':{'type':'shell'},'fit':{'epochs':1}}", 422, "invalid_value", "fit"},
    {"{'interactive':{'type':'shell'},'resources':{'workers':2}}", 422, "invalid_value", "resources.workers"},
    {"{'interactive':{'type':'shell'},'resources':{'evaluator':true}}", 422, "invalid_value", "resources.evaluator"},
    {"{'interactive':{'type':'notebook'},'ports':[" PORTS8 "]}", 422, "invalid_value", "ports"},
    {"{'interactive':{'type':'shell'},'environment':{'image':'Bad Image'}}", 422, "invalid_value", "environment.image"},
    {"{'command':{'argv':['x']},'idle_timeout':60}", 422, "invalid_value", "idle_timeout"},
    {TOP("'idle_timeout':'30m'"), 422, "invalid_value", "idle_timeout"},
    {"{'interactive':{'type':'shell'},'idle_timeout':-1}", 422, "invalid_value", "idle_timeout"},
    {"{'interactive':{'type':'shell'},'idle_timeout':31536001}", 422, "invalid_value", "idle_timeout"},
    {"{'interactive':{'type':'shell'},'idle_timeout':1.5}", 422, "invalid_type", "idle_timeout"},
    {"{'interactive':{'type':'shell'},'idle_timeout':true}", 422, "invalid_type", "idle_timeout"},
    {"{'interactive':{'type':'shell'},'idle_timeout':null}", 422, "invalid_type", "idle_timeout"},
    {"{'interactive':{'type':'shell'},'idle_timeout':'30x'}", 422, "invalid_value", "idle_timeout"},
    {"{'interactive':{'type':'shell'},'idle_timeout':'30 m'}", 422, "invalid_value", "idle_timeout"},
    {"{'interactive':{'type':'shell'},'idle_timeout':' 30m'}", 422, "invalid_value", "idle_timeout"},
    {"{'interactive':{'type':'shell'},'idle_timeout':''}", 422, "invalid_value", "idle_timeout"},
    {"{'interactive':{'type':'shell'},'idle_timeout':'-5m'}", 422, "invalid_value", "idle_timeout"},
    {"{'interactive':{'type':'shell'},'idle_timeout':'m'}", 422, "invalid_value", "idle_timeout"},
    {"{'interactive':{'type':'shell'},'idle_timeout':'366d'}", 422, "invalid_value", "idle_timeout"},
    {"{'interactive':{'type':'shell'},'idle_timeout':'1e3'}", 422, "invalid_value", "idle_timeout"},
    {"{'interactive':{'type':'shell'},'idle_timeout':'0x10'}", 422, "invalid_value", "idle_timeout"},
    {"{'interactive':{'type':'shell'},'idle_timeout':'1.h'}", 422, "invalid_value", "idle_timeout"},
    {"{'interactive':{'type':'shell'},'idle_timeout':'30mm'}", 422, "invalid_value", "idle_timeout"},
};

#define N_BAD ((int)(sizeof BAD / sizeof BAD[0]))

/* Every row in one test (a fork per row costs seconds under ASan); each
 * row that goes wrong is listed in the failure message. */
START_TEST(test_bad_specs) {
    buf report;
    buf_init(&report, 1 << 20);
    int wrong = 0;
    for (int i = 0; i < N_BAD; i++) {
        const bad_case *c = &BAD[i];
        jobspec s;
        spec_error e;
        memset(&e, 0x55, sizeof e);
        int rc = parse_q(c->spec, &s, &e);
        if (rc == 0) {
            wrong++;
            buf_printf(&report, "row %d: expected %s at '%s' but it parsed: %s\n", i, c->code,
                       c->field, c->spec);
            jobspec_release(&s);
            continue;
        }
        if (e.status != c->status || strcmp(e.code, c->code) != 0 ||
            strcmp(e.field, c->field) != 0 || strlen(e.message) < 10 || s.command.argv) {
            wrong++;
            buf_printf(&report, "row %d: expected %d %s '%s', got %d %s '%s' (%s)\n  spec: %s\n",
                       i, c->status, c->code, c->field, e.status, e.code, e.field, e.message,
                       c->spec);
        }
    }
    ck_assert_msg(wrong == 0, "%d of %d bad specs answered wrongly:\n%s", wrong, N_BAD,
                  report.data ? report.data : "");
    buf_release(&report);
}
END_TEST

/* No two rows are the same spec. */
START_TEST(test_bad_specs_distinct) {
    ck_assert_int_ge(N_BAD, 50);
    for (int i = 0; i < N_BAD; i++)
        for (int j = i + 1; j < N_BAD; j++)
            ck_assert_msg(strcmp(BAD[i].spec, BAD[j].spec) != 0, "rows %d and %d are the same", i,
                          j);
}
END_TEST

/* ---------------------------------------------------------------- messages */

static void expect_message(const char *spec, const char *field, const char *needle) {
    jobspec s;
    spec_error e;
    ck_assert_int_eq(parse_q(spec, &s, &e), -1);
    ck_assert_str_eq(e.field, field);
    ck_assert_msg(strstr(e.message, needle) != NULL, "message '%s' lacks '%s'", e.message, needle);
}

START_TEST(test_messages) {
    expect_message(LAYERS("{'type':'dense','units':0}"), "model.layers[0].units",
                   "must be an integer between 1 and 65536, got 0");
    expect_message(LAYERS("{'type':'dense','unitz':10}"), "model.layers[0].unitz",
                   "did you mean \"units\"");
    expect_message(OPT("{'type':'sgd','rho':0.9}"), "compile.optimizer.rho",
                   "the sgd optimizer has no field \"rho\"");
    expect_message(TOP("'strategy':{'type':'tpu'}"), "strategy.type", "no TPU hardware");
    expect_message("{'command':{'argv':['x'],'env':{'TF_CONFIG':'{}'}}}", "command.env.TF_CONFIG",
                   "set by trainyard for every task and cannot be overridden");
    expect_message("{'command':{'argv':['x'],'working_dir':'a/../b'}}", "command.working_dir",
                   "no \"..\" component");
    expect_message(TOP("'strategy':{'type':'multi_worker_mirrored'},'resources':{'workers':2,"
                       "'devices_per_worker':2},'fit':{'batch_size':30}"),
                   "fit.batch_size", "divisible by the 4 replicas (2 workers x 2 devices_per_worker)");
    expect_message(TOP("'strategy':{'type':'multi_worker_mirrored'},'resources':{'workers':2,"
                       "'devices_per_worker':2},'fit':{'batch_size':32,'gradient_accumulation_steps':9}"),
                   "fit.gradient_accumulation_steps",
                   "must be at most the 8 rows each replica gets of a global batch (batch_size 32 over "
                   "4 replicas): 9 micro-batches");
    expect_message(TOP("'fit':{'gradient_accumulation_steps':0}"), "fit.gradient_accumulation_steps",
                   "must be an integer between 1 and 65536, got 0");
    expect_message(LAYERS("{'type':'dense','units':5,'activation':'softmax'}"),
                   "model.layers[0].units", "must be 10");
    expect_message(OPT("{'type':'sgd','momentum':1}"), "compile.optimizer.momentum",
                   "must be a number in [0, 1), got 1");
    expect_message(OPT("{'type':'sgd','learning_rate':0}"), "compile.optimizer.learning_rate",
                   "must be a number > 0, got 0");
    expect_message(TOP("'priority':'high'"), "priority",
                   "must be an integer between 0 and 1000, got \"high\"");
    expect_message(WDATA("{'source':'cifar10'}"), "data.source", "got \"cifar10\"");
    expect_message(WDATA("{'source':'fashion-mnist','features':784}"), "data.features",
                   "source fashion-mnist has no field \"features\"");
    expect_message(LAYERS("{'type':'dense','units':10,'activation':'softmax','input_shape':[100]}"),
                   "model.layers[0].input_shape", "[784], [28, 28] or [28, 28, 1], got [100]");
    expect_message("{'a':1,'a':2}", "a", "duplicate key");
    expect_message(TOP("'resources':{'memory':'8MiB'}"), "resources.memory",
                   "must be between 16MiB and 64TiB, got \"8MiB\"");
    expect_message(TOP("'resources':{'memory':1000}"), "resources.memory",
                   "must be between 16MiB and 64TiB, got 1000 bytes");
    expect_message(TOP("'resources':{'memory':'4gib'}"), "resources.memory",
                   "unknown unit \"gib\" in \"4gib\"");
    expect_message(TOP("'resources':{'memory':'lots'}"), "resources.memory",
                   "a size such as \"4GiB\"");
    expect_message(TOP("'resources':{'memory':true}"), "resources.memory", "got true");
    expect_message("{\n'name':\n}", "", "line 3, column 1");
}
END_TEST

/* A key that cannot be printed is shown safely in the field and message. */
START_TEST(test_unprintable_key) {
    jobspec s;
    spec_error e;
    const char *spec = "{\"bad\\\"key\\n\":1}";
    ck_assert_int_eq(jobspec_parse(spec, strlen(spec), &s, &e), -1);
    ck_assert_str_eq(e.code, "unknown_field");
    ck_assert_str_eq(e.field, "bad?key?");
    ck_assert_ptr_null(strchr(e.message, '\n'));
}
END_TEST

/* ---------------------------------------------------------------- raw input */

START_TEST(test_depth_limit) {
    /* 32 levels: refused for its unknown field, not as bad JSON */
    char doc[256];
    size_t n = 0;
    n += (size_t)snprintf(doc + n, sizeof doc - n, "{\"x\":");
    for (int i = 0; i < 31; i++) doc[n++] = '[';
    for (int i = 0; i < 31; i++) doc[n++] = ']';
    doc[n++] = '}';
    doc[n] = '\0';
    jobspec s;
    spec_error e;
    ck_assert_int_eq(jobspec_parse(doc, n, &s, &e), -1);
    ck_assert_str_eq(e.code, "unknown_field");
    /* 33 levels: bad_json */
    n = 0;
    n += (size_t)snprintf(doc + n, sizeof doc - n, "{\"x\":");
    for (int i = 0; i < 32; i++) doc[n++] = '[';
    for (int i = 0; i < 32; i++) doc[n++] = ']';
    doc[n++] = '}';
    ck_assert_int_eq(jobspec_parse(doc, n, &s, &e), -1);
    ck_assert_int_eq(e.status, 400);
    ck_assert_str_eq(e.code, "bad_json");
    ck_assert_ptr_nonnull(strstr(e.message, "deeper than 32"));
    /* very deep input never reaches cJSON's recursion */
    size_t big = 200000;
    char *deep = xmalloc(big);
    memset(deep, '[', big);
    ck_assert_int_eq(jobspec_parse(deep, big, &s, &e), -1);
    ck_assert_str_eq(e.code, "bad_json");
    free(deep);
}
END_TEST

START_TEST(test_not_nul_terminated) {
    char *j = q(GOOD);
    size_t n = strlen(j);
    char *exact = xmalloc(n); /* no room for a NUL: ASan catches an over-read */
    memcpy(exact, j, n);
    jobspec s;
    spec_error e;
    ck_assert_int_eq(jobspec_parse(exact, n, &s, &e), 0);
    /* a length shorter than the buffer ends the document there */
    ck_assert_int_eq(jobspec_parse(exact, n - 1, &s, &e), -1);
    ck_assert_str_eq(e.code, "bad_json");
    /* a NUL inside the length is refused */
    exact[5] = '\0';
    ck_assert_int_eq(jobspec_parse(exact, n, &s, &e), -1);
    ck_assert_str_eq(e.code, "bad_json");
    free(exact);
    free(j);
    ck_assert_int_eq(jobspec_parse(NULL, 0, &s, &e), -1);
    ck_assert_int_eq(e.status, 400);
    /* err may be NULL */
    ck_assert_int_eq(jobspec_parse("{}", 2, &s, NULL), -1);
}
END_TEST

static char *read_example(const char *name, size_t *len) {
    char path[256];
    ck_assert_int_eq(sfmt(path, sizeof path, "examples/%s", name), 0);
    char *data = file_read_all(path, 1 << 20, len);
    ck_assert_msg(data != NULL, "cannot read %s (run from the repository root)", path);
    return data;
}

static const char *const EXAMPLES[] = {"fashion_mnist_mlp.json", "fashion_mnist_quick.json",
                                       "synthetic_binary.json", "multi_worker_cpu.json",
                                       "mirrored_cpu.json", "parameter_server_cpu.json",
                                       "fashion_mnist_cnn.json"};
#define N_EXAMPLES ((int)(sizeof EXAMPLES / sizeof EXAMPLES[0]))

/* Every prefix of a spec is bad JSON (400); random byte changes never crash
 * and always answer a 400 or a 422 with a code. */
START_TEST(test_truncation_and_mutation) {
    size_t len;
    char *doc = read_example("fashion_mnist_mlp.json", &len);
    size_t last = len;
    while (last > 0 && doc[last - 1] != '}') last--;
    jobspec s;
    spec_error e;
    for (size_t n = 0; n + 1 < last; n++) {
        ck_assert_msg(jobspec_parse(doc, n, &s, &e) == -1, "prefix %zu parsed", n);
        ck_assert_int_eq(e.status, 400);
    }
    unsigned seed = 12345;
    char *m = xmalloc(len);
    for (int round = 0; round < 3000; round++) {
        memcpy(m, doc, len);
        int flips = 1 + round % 3;
        for (int k = 0; k < flips; k++) {
            seed = seed * 1103515245u + 12345u;
            size_t at = (seed >> 8) % len;
            seed = seed * 1103515245u + 12345u;
            static const char pool[] = "{}[]\",:0123456789-.eE tfnaxyz\\\x80\xff";
            m[at] = pool[(seed >> 8) % (sizeof pool - 1)];
        }
        int rc = jobspec_parse(m, len, &s, &e);
        if (rc == 0) continue;
        ck_assert(e.status == 400 || e.status == 422);
        ck_assert(e.code[0] != '\0');
        ck_assert(e.message[0] != '\0');
    }
    free(m);
    free(doc);
}
END_TEST

/* ---------------------------------------------------------------- good specs */

START_TEST(test_examples_parse) {
    for (int i = 0; i < N_EXAMPLES; i++) {
        size_t len;
        char *doc = read_example(EXAMPLES[i], &len);
        jobspec s;
        spec_error e;
        int rc = jobspec_parse(doc, len, &s, &e);
        ck_assert_msg(rc == 0, "%s: %s %s: %s", EXAMPLES[i], e.code, e.field, e.message);
        ck_assert_int_eq(s.kind, JOB_KIND_TRAIN);
        free(doc);
    }
}
END_TEST

START_TEST(test_fashion_mlp_example) {
    size_t len;
    char *doc = read_example("fashion_mnist_mlp.json", &len);
    jobspec s;
    spec_error e;
    ck_assert_int_eq(jobspec_parse(doc, len, &s, &e), 0);
    free(doc);
    ck_assert_str_eq(s.name, "fashion-mlp");
    ck_assert_int_eq(s.n_layers, 5);
    ck_assert_int_eq(s.layers[0].type, LAYER_DENSE);
    ck_assert_int_eq(s.layers[0].units, 256);
    ck_assert_int_eq(s.layers[0].activation, ACT_RELU);
    ck_assert_int_eq(s.layers[1].type, LAYER_DROPOUT);
    ck_assert_float_eq(s.layers[1].rate, 0.4f);
    ck_assert_int_eq(s.layers[2].units, 128);
    ck_assert_float_eq(s.layers[3].rate, 0.3f);
    ck_assert_int_eq(s.layers[4].units, 10);
    ck_assert_int_eq(s.layers[4].activation, ACT_SOFTMAX);
    ck_assert_int_eq(s.input_rank, 1);
    ck_assert_int_eq(s.input_shape[0], 784);
    ck_assert_int_eq(s.input_size, 784);
    ck_assert_int_eq(s.output_size, 10);
    ck_assert_int_eq(s.optimizer.type, OPT_RMSPROP);
    ck_assert_float_eq(s.optimizer.learning_rate, 0.001f);
    ck_assert_float_eq(s.optimizer.rho, 0.9f);
    ck_assert_float_eq(s.optimizer.epsilon, 1e-7f);
    ck_assert_int_eq(s.loss, LOSS_CATEGORICAL_CROSSENTROPY);
    ck_assert_int_eq(s.metric_accuracy, 1);
    ck_assert_int_eq(s.data.source, DATA_FASHION_MNIST);
    ck_assert_float_eq(s.data.validation_split, 0.1f);
    ck_assert_int_eq(s.data.shuffle_buffer, 60000);
    ck_assert_uint_eq(s.data.seed, 7);
    ck_assert_int_eq(s.fit.epochs, 10);
    ck_assert_int_eq(s.fit.batch_size, 128);
    ck_assert_int_eq(s.fit.steps_per_epoch, 0);
    ck_assert_int_eq(s.strategy.type, STRAT_MIRRORED);
    ck_assert_int_eq(s.resources.workers, 1);
    ck_assert_int_eq(s.resources.devices_per_worker, 1);
    ck_assert_int_eq(s.resources.device, DEVICE_CPU);
    ck_assert_int_eq(s.max_runtime_s, 3600);
    ck_assert_int_eq(s.preemptible, 1);
    ck_assert_int_eq(jobspec_replicas(&s), 1);
}
END_TEST

START_TEST(test_defaults) {
    jobspec s;
    parse_ok(GOOD, &s);
    ck_assert_int_eq(s.kind, JOB_KIND_TRAIN);
    ck_assert_str_eq(s.name, "job");
    ck_assert_int_eq(s.priority, 50);
    ck_assert_int_eq(s.max_runtime_s, 86400);
    ck_assert_int_eq(s.preemptible, 0);
    ck_assert_int_eq(s.queue_if_infeasible, 0);
    ck_assert_int_eq(s.max_restarts, 3);
    /* dense defaults, and the input filled in from the data */
    const layer_spec *l = &s.layers[0];
    ck_assert_int_eq(l->use_bias, 1);
    ck_assert_int_eq(l->kernel_initializer, INIT_GLOROT_UNIFORM);
    ck_assert_int_eq(l->bias_initializer, INIT_ZEROS);
    ck_assert_int_eq(l->input_rank, 1);
    ck_assert_int_eq(l->input_shape[0], 784);
    ck_assert_int_eq(s.input_size, 784);
    /* sgd */
    ck_assert_int_eq(s.optimizer.type, OPT_SGD);
    ck_assert_float_eq(s.optimizer.learning_rate, 0.01f);
    ck_assert_float_eq(s.optimizer.momentum, 0.0f);
    ck_assert_int_eq(s.optimizer.nesterov, 0);
    ck_assert_int_eq(s.metric_accuracy, 0);
    /* data */
    ck_assert_str_eq(s.data.path, "");
    ck_assert_float_eq(s.data.validation_split, 0.0f);
    ck_assert_int_eq(s.data.shuffle_buffer, -1);
    ck_assert_uint_eq(s.data.seed, 0);
    ck_assert_int_eq(s.data.limit, 0);
    /* fit, strategy, resources, checkpoint */
    ck_assert_int_eq(s.fit.epochs, 1);
    ck_assert_int_eq(s.fit.batch_size, 32);
    ck_assert_int_eq(s.fit.steps_per_epoch, 0);
    ck_assert_int_eq(s.fit.gradient_accumulation_steps, 1);
    ck_assert_int_eq(jobspec_micro_batches(&s, 1), 1);
    ck_assert_int_eq(s.strategy.type, STRAT_DEFAULT);
    ck_assert_int_eq(s.strategy.communication, COMM_AUTO);
    ck_assert_int_eq(s.strategy.cross_device_ops, CDO_AUTO);
    ck_assert_int_eq(s.resources.workers, 1);
    ck_assert_int_eq(s.resources.devices_per_worker, 1);
    ck_assert_int_eq(s.resources.device, DEVICE_CPU);
    ck_assert_int_eq(s.resources.ps, 0);
    ck_assert_int_eq(s.checkpoint.every_epochs, 1);
    ck_assert_int_eq(s.checkpoint.keep, 3);
    ck_assert_int_eq(jobspec_replicas(&s), 1);
    ck_assert_int_eq(jobspec_devices(&s), 1);
    jobspec_release(&s);
}
END_TEST

START_TEST(test_optimizer_defaults) {
    jobspec s;
    parse_ok(OPT("'rmsprop'"), &s);
    ck_assert_float_eq(s.optimizer.learning_rate, 0.001f);
    ck_assert_float_eq(s.optimizer.rho, 0.9f);
    ck_assert_float_eq(s.optimizer.epsilon, 1e-7f);
    ck_assert_int_eq(s.optimizer.centered, 0);
    parse_ok(OPT("{'type':'adam'}"), &s);
    ck_assert_float_eq(s.optimizer.learning_rate, 0.001f);
    ck_assert_float_eq(s.optimizer.beta_1, 0.9f);
    ck_assert_float_eq(s.optimizer.beta_2, 0.999f);
    ck_assert_float_eq(s.optimizer.epsilon, 1e-7f);
    ck_assert_int_eq(s.optimizer.amsgrad, 0);
    parse_ok(OPT("'adagrad'"), &s);
    ck_assert_float_eq(s.optimizer.learning_rate, 0.001f);
    ck_assert_float_eq(s.optimizer.initial_accumulator_value, 0.1f);
    ck_assert_float_eq(s.optimizer.epsilon, 1e-7f);
    parse_ok(OPT("{'type':'sgd','learning_rate':0.2,'momentum':0.9,'nesterov':true}"), &s);
    ck_assert_float_eq(s.optimizer.learning_rate, 0.2f);
    ck_assert_float_eq(s.optimizer.momentum, 0.9f);
    ck_assert_int_eq(s.optimizer.nesterov, 1);
    parse_ok(OPT("{'type':'rmsprop','rho':0.95,'momentum':0.5,'epsilon':1e-6,'centered':true}"),
             &s);
    ck_assert_float_eq(s.optimizer.rho, 0.95f);
    ck_assert_int_eq(s.optimizer.centered, 1);
    parse_ok(OPT("{'type':'adam','beta_1':0.8,'beta_2':0.99,'amsgrad':true}"), &s);
    ck_assert_float_eq(s.optimizer.beta_2, 0.99f);
    ck_assert_int_eq(s.optimizer.amsgrad, 1);
    parse_ok(OPT("{'type':'adagrad','initial_accumulator_value':0}"), &s);
    ck_assert_float_eq(s.optimizer.initial_accumulator_value, 0.0f);
}
END_TEST

/* Specs that must pass; also the round-trip set. */
static const char *const GOOD_SPECS[] = {
    GOOD,
    LAYERS("{'type':'flatten','input_shape':[28,28]},{'type':'dense','units':32,'activation':"
           "'tanh','kernel_initializer':'he_normal','bias_initializer':'zeros','use_bias':false},"
           "{'type':'dropout','rate':0,'seed':99},{'type':'dense','units':10},"
           "{'type':'activation','activation':'softmax'}"),
    LAYERS("{'type':'flatten'},{'type':'dense','units':16,'activation':null},"
           "{'type':'dense','units':10,'activation':'softmax'}"),
    LAYERS("{'type':'dropout','rate':0.2,'input_shape':[784]}," OUT10),
    "{" MODEL ",'compile':{'optimizer':'adam','loss':'categorical_crossentropy',"
    "'metrics':['acc','accuracy']}," DATA "}",
    "{" MODEL ",'compile':{'optimizer':'sgd','loss':'mean_squared_error'}," DATA "}",
    "{" MODEL "," COMP ",'data':{'source':'mnist','path':'/data/mnist','limit':1000,"
    "'validation_split':0.2,'shuffle_buffer':0,'seed':9007199254740991}}",
    CSV("{'source':'csv','path':'/d.csv'}"),
    CSV("{'source':'csv','path':'/d.csv','label_column':'species','header':true}"),
    CSV("{'source':'csv','path':'/d.csv','label_column':-2,'header':false}"),
    "{'model':{'layers':[{'type':'dense','units':1,'input_shape':[3]}]},"
    "'compile':{'optimizer':'sgd','loss':'mse'},'data':{'source':'csv','path':'/r.csv'}}",
    SYN("'fit':{'epochs':3,'batch_size':100,'steps_per_epoch':10}"),
    SYN_LAYERS("{'type':'dense','units':1},{'type':'activation','activation':'sigmoid'}",
               "binary_crossentropy"),
    SYN_LAYERS("{'type':'dense','units':2,'activation':'softmax'}",
               "sparse_categorical_crossentropy"),
    "{" SYN_MODEL "," SYN_COMP ",'data':{'source':'synthetic','examples':5000,'features':10,"
    "'seed':3,'limit':4000,'validation_split':0.25}}",
    TOP("'name':'A.b_c-9','priority':1000,'max_runtime_s':31536000,'preemptible':true,"
        "'queue_if_infeasible':true,'max_restarts':0"),
    TOP("'strategy':{'type':'one_device'},'resources':{'device':'gpu'}"),
    TOP("'strategy':{'type':'mirrored','cross_device_ops':'nccl'},"
        "'resources':{'devices_per_worker':4,'device':'gpu'},'fit':{'batch_size':128}"),
    TOP("'strategy':{'type':'mirrored','cross_device_ops':'hierarchical_copy'},"
        "'resources':{'devices_per_worker':2}"),
    TOP("'strategy':{'type':'central_storage'},'resources':{'devices_per_worker':2}"),
    TOP("'strategy':{'type':'multi_worker_mirrored','communication':'nccl'},"
        "'resources':{'workers':4,'devices_per_worker':8,'device':'gpu'},'fit':{'batch_size':256}"),
    TOP("'strategy':{'type':'parameter_server','communication':'ring'},"
        "'resources':{'workers':2,'ps':1},'fit':{'batch_size':64}"),
    TOP("'checkpoint':{'every_epochs':0,'keep':100}"),
    TOP("'fit':{'batch_size':128,'steps_per_epoch':469}"),
    TOP("'resources':{'memory':'4GiB'}"),
    TOP("'resources':{'workers':1,'memory':'1.5GiB','device':'gpu'}"),
    TOP("'resources':{'memory':2000000000}"),
    TOP("'resources':{'memory':'800 M'}"),
    TOP("'strategy':{'type':'parameter_server'},'resources':{'workers':2,'ps':1,'memory':'2G'}"),
    LAYERS(CNN_LAYERS),
    LAYERS("{'type':'reshape','target_shape':[-1,28,1]},{'type':'conv2d','filters':4,'kernel_size':[5,3],"
           "'strides':2,'padding':'same','use_bias':false,'kernel_initializer':'he_normal',"
           "'kernel_regularizer':{'l2':0.001}},{'type':'batch_normalization','center':false,"
           "'momentum':0.9,'epsilon':0.01},{'type':'activation','activation':'relu'},"
           "{'type':'average_pooling2d','pool_size':3,'strides':1,'padding':'same'},"
           "{'type':'global_average_pooling2d'},{'type':'batch_normalization','scale':false}," OUT10),
    LAYERS("{'type':'max_pooling2d','input_shape':[28,28,1],'strides':null},{'type':'flatten'}," OUT10),
};
#define N_GOOD ((int)(sizeof GOOD_SPECS / sizeof GOOD_SPECS[0]))

START_TEST(test_good_specs) {
    for (int i = 0; i < N_GOOD; i++) {
        jobspec s;
        spec_error e;
        int rc = parse_q(GOOD_SPECS[i], &s, &e);
        ck_assert_msg(rc == 0, "good spec %d refused: %d %s '%s': %s\n%s", i, e.status, e.code,
                      e.field, e.message, GOOD_SPECS[i]);
        jobspec_release(&s);
    }
}
END_TEST

START_TEST(test_good_values) {
    jobspec s;
    parse_ok(GOOD_SPECS[1], &s);
    ck_assert_int_eq(s.n_layers, 5);
    ck_assert_int_eq(s.input_rank, 2);
    ck_assert_int_eq(s.input_size, 784);
    ck_assert_int_eq(s.output_size, 10);
    ck_assert_int_eq(s.layers[1].activation, ACT_TANH);
    ck_assert_int_eq(s.layers[1].use_bias, 0);
    ck_assert_int_eq(s.layers[1].kernel_initializer, INIT_HE_NORMAL);
    ck_assert_int_eq(s.layers[2].has_seed, 1);
    ck_assert_uint_eq(s.layers[2].seed, 99);
    ck_assert_int_eq(s.layers[3].activation, ACT_LINEAR);
    ck_assert_int_eq(s.layers[4].activation, ACT_SOFTMAX);

    parse_ok(GOOD_SPECS[4], &s);
    ck_assert_int_eq(s.metric_accuracy, 1);
    parse_ok(GOOD_SPECS[5], &s);
    ck_assert_int_eq(s.loss, LOSS_MSE);
    parse_ok(GOOD_SPECS[6], &s);
    ck_assert_str_eq(s.data.path, "/data/mnist");
    ck_assert_int_eq(s.data.limit, 1000);
    ck_assert_int_eq(s.data.shuffle_buffer, 0);
    ck_assert_uint_eq(s.data.seed, 9007199254740991ULL);
    parse_ok(GOOD_SPECS[7], &s);
    ck_assert_int_eq(s.data.label_column, -1);
    ck_assert_int_eq(s.data.header, 1);
    ck_assert_int_eq(s.input_size, 4);
    parse_ok(GOOD_SPECS[8], &s);
    ck_assert_str_eq(s.data.label_column_name, "species");
    parse_ok(GOOD_SPECS[9], &s);
    ck_assert_int_eq(s.data.label_column, -2);
    ck_assert_int_eq(s.data.header, 0);
    parse_ok(GOOD_SPECS[11], &s);
    ck_assert_int_eq(s.data.examples, 1000);
    ck_assert_int_eq(s.data.features, 10);
    ck_assert_int_eq(s.input_size, 10);
    ck_assert_int_eq(s.fit.steps_per_epoch, 10);
    parse_ok(GOOD_SPECS[15], &s);
    ck_assert_str_eq(s.name, "A.b_c-9");
    ck_assert_int_eq(s.priority, 1000);
    ck_assert_int_eq(s.queue_if_infeasible, 1);
    ck_assert_int_eq(s.max_restarts, 0);
    parse_ok(GOOD_SPECS[17], &s);
    ck_assert_int_eq(s.strategy.cross_device_ops, CDO_NCCL);
    ck_assert_int_eq(s.resources.device, DEVICE_GPU);
    ck_assert_int_eq(jobspec_replicas(&s), 4);
    parse_ok(GOOD_SPECS[20], &s);
    ck_assert_int_eq(s.strategy.communication, COMM_NCCL);
    ck_assert_int_eq(jobspec_replicas(&s), 32);
    ck_assert_int_eq(jobspec_devices(&s), 32);
    parse_ok(GOOD_SPECS[21], &s);
    ck_assert_int_eq(s.strategy.type, STRAT_PARAMETER_SERVER);
    ck_assert_int_eq(s.resources.ps, 1);
    ck_assert_int_eq(s.strategy.communication, COMM_RING);
}
END_TEST

/* Every size field of the spec takes a string and a JSON integer of bytes
 * under one rule: at and past each bound (16 MiB, 64 TiB) both forms are
 * accepted with the same value or refused alike (422 naming the field). */
START_TEST(test_sizes_alike) {
    static const struct {
        const char *text, *bytes;
        long long mib; /* kept, or -1: refused */
    } cases[] = {
        {"'16MiB'", "16777216", 16},
        {"'16777216'", "16777216", 16},
        {"'16777216B'", "16777216", 16},
        {"'16384KiB'", "16777216", 16},
        {"'16777217'", "16777217", 17},
        {"'16777215'", "16777215", -1},
        {"'16383KiB'", "16776192", -1},
        {"'8MiB'", "8388608", -1},
        {"'15.9999999MiB'", "16777215", -1},
        {"'0'", "0", -1},
        {"'-16MiB'", "-16777216", -1},
        {"'64TiB'", "70368744177664", 67108864},
        {"'70368744177664'", "70368744177664", 67108864},
        {"'70368744177665'", "70368744177665", -1},
        {"'64.000000001TiB'", "70368744177665", -1},
        {"'65TiB'", "71468255805440", -1},
        {"'1PiB'", "1125899906842624", -1},
        {"'99999999999999999999999'", "99999999999999999999999", -1},
    };
    static const char *const fields[] = {"resources.memory", "logs.max_size"};
    static const char *const wraps[] = {"'resources':{'memory':%s}", "'logs':{'max_size':%s}"};
    for (int k = 0; k < 2; k++) {
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
            const char *forms[2] = {cases[i].text, cases[i].bytes};
            for (int f = 0; f < 2; f++) {
                char extra[128], spec[1024];
                snprintf(extra, sizeof extra, wraps[k], forms[f]);
                snprintf(spec, sizeof spec, "{" BASE ",%s}", extra);
                jobspec s;
                spec_error e;
                int rc = parse_q(spec, &s, &e);
                if (cases[i].mib < 0) {
                    ck_assert_msg(rc == -1, "%s parsed", extra);
                    ck_assert_msg(e.status == 422 && strcmp(e.code, "invalid_value") == 0 &&
                                      strcmp(e.field, fields[k]) == 0,
                                  "%s: %d %s %s", extra, e.status, e.code, e.field);
                    ck_assert_msg(strstr(e.message, "must be between 16MiB and 64TiB, got "), "%s: %s", extra,
                                  e.message);
                    continue;
                }
                ck_assert_msg(rc == 0, "%s refused: %s", extra, e.message);
                long long have = k == 0 ? (long long)s.resources.memory_mb : (long long)s.logs.max_mb;
                ck_assert_msg(have == cases[i].mib, "%s: %lld MiB, expected %lld", extra, have, cases[i].mib);
                jobspec_release(&s);
            }
        }
    }
    /* the kinds' bounds are the ones the table states */
    ck_assert_int_eq(JOBSPEC_SIZE_MEMORY.min, 16LL << 20);
    ck_assert_int_eq(JOBSPEC_SIZE_MEMORY.max, 64LL << 40);
    ck_assert_int_eq(JOBSPEC_SIZE_STORAGE_QUOTA.min, 0);
    ck_assert_int_eq(JOBSPEC_SIZE_STORAGE_QUOTA.max, 64LL << 40);
    ck_assert_int_eq(JOBSPEC_SIZE_STORAGE_QUOTA.unit, 1);
}
END_TEST

/* common/size.c: exact values, every unit, rounding up to a byte, bounds on
 * the exact value, and no overflow near the largest sizes. */
START_TEST(test_size_parse) {
    static const struct {
        const char *text;
        long long min, max, bytes;
        size_status st;
    } cases[] = {
        {"0", 0, 100, 0, SIZE_OK},
        {"1536", 0, 1LL << 40, 1536, SIZE_OK},
        {"1.5KiB", 0, 1LL << 40, 1536, SIZE_OK},
        {"1.1KiB", 0, 1LL << 40, 1127, SIZE_OK}, /* 1126.4, rounded up */
        {"2 G", 0, 1LL << 40, 2000000000, SIZE_OK},
        {"3TB", 0, 1LL << 62, 3000000000000LL, SIZE_OK},
        {"1PiB", 0, 1LL << 62, 1LL << 50, SIZE_OK},
        {"2P", 0, 1LL << 62, 2000000000000000LL, SIZE_OK},
        {"4096PiB", 0, 1LL << 62, 1LL << 62, SIZE_OK},
        {"4096.000000001PiB", 0, 1LL << 62, 0, SIZE_ABOVE},
        {"4097PiB", 0, 1LL << 62, 0, SIZE_ABOVE},
        {"999999999999999999999999999999PB", 0, 1LL << 62, 0, SIZE_ABOVE},
        {"4611686018427387904", 0, 1LL << 62, 1LL << 62, SIZE_OK},
        {"4611686018427387905", 0, 1LL << 62, 0, SIZE_ABOVE},
        {"100", 101, 200, 0, SIZE_BELOW},
        {"100.5", 101, 200, 0, SIZE_BELOW},
        {"100.5", 100, 200, 101, SIZE_OK},
        {"200.000000001", 100, 200, 0, SIZE_ABOVE},
        {"-0", 0, 200, 0, SIZE_BELOW},
        {"1.0000000001", 0, 200, 0, SIZE_DECIMALS},
        {"", 0, 200, 0, SIZE_SYNTAX},
        {"MiB", 0, 200, 0, SIZE_SYNTAX},
        {".5", 0, 200, 0, SIZE_SYNTAX},
        {"1.", 0, 200, 0, SIZE_SYNTAX},
        {" 1", 0, 200, 0, SIZE_SYNTAX},
        {"1e3", 0, 2000, 0, SIZE_UNIT},
        {"0x10", 0, 2000, 0, SIZE_UNIT},
        {"1 mib", 0, 1LL << 30, 0, SIZE_UNIT},
        {"1MiB ", 0, 1LL << 30, 0, SIZE_UNIT},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int64_t b = -7;
        const char *unit = NULL;
        size_status st = size_parse(cases[i].text, cases[i].min, cases[i].max, &b, &unit);
        ck_assert_msg(st == cases[i].st, "'%s': status %d, expected %d", cases[i].text, (int)st, (int)cases[i].st);
        if (st == SIZE_OK)
            ck_assert_msg(b == cases[i].bytes, "'%s': %lld bytes, expected %lld", cases[i].text, (long long)b,
                          cases[i].bytes);
        else
            ck_assert_msg(b == -7, "'%s': *bytes written on failure", cases[i].text);
    }
    const char *unit = NULL;
    int64_t b = 0;
    ck_assert_int_eq(size_parse("4 gib", 0, 1LL << 40, &b, &unit), SIZE_UNIT);
    ck_assert_str_eq(unit, "gib");
    char t[32];
    ck_assert_str_eq(size_text(0, t, sizeof t), "0B");
    ck_assert_str_eq(size_text(1000, t, sizeof t), "1000B");
    ck_assert_str_eq(size_text(1536, t, sizeof t), "1536B");
    ck_assert_str_eq(size_text(16LL << 20, t, sizeof t), "16MiB");
    ck_assert_str_eq(size_text(64LL << 40, t, sizeof t), "64TiB");
    ck_assert_str_eq(size_text(1LL << 50, t, sizeof t), "1PiB");
    ck_assert_str_eq(size_text(1LL << 62, t, sizeof t), "4096PiB");
}
END_TEST

/* resources.memory: each written form, rounded up to whole MiB. */
START_TEST(test_memory_values) {
    static const struct { const char *memory; long long mib; } cases[] = {
        {"'512MiB'", 512}, {"'4GiB'", 4096}, {"'1.5GiB'", 1536}, {"'2G'", 1908}, {"'800M'", 763},
        {"'16MiB'", 16}, {"'64TiB'", 67108864}, {"16777216", 16}, {"16777217", 17}, {"'17000000'", 17},
        {"'17000000B'", 17}, {"'1 GiB'", 1024}, {"'1   MB'", 0}, {"'1000000KB'", 954},
        {"'2T'", 1907349}, {"'1TB'", 953675}, {"'20000K'", 20}, {"'0.5GiB'", 512},
        {"'1.000000001GiB'", 1025}, {"'0.015625TiB'", 16384}, {"'32768KiB'", 32}, {"4e9", 3815},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char spec[512];
        snprintf(spec, sizeof spec, TOP("'resources':{'memory':%s}"), cases[i].memory);
        jobspec s;
        spec_error e;
        int rc = parse_q(spec, &s, &e);
        if (cases[i].mib == 0) {   /* below 16 MiB */
            ck_assert_msg(rc == -1 && strcmp(e.field, "resources.memory") == 0, "%s parsed", cases[i].memory);
            continue;
        }
        ck_assert_msg(rc == 0, "%s refused: %s", cases[i].memory, e.message);
        ck_assert_msg(s.resources.memory_mb == cases[i].mib, "%s: %lld MiB, expected %lld", cases[i].memory,
                      (long long)s.resources.memory_mb, cases[i].mib);
        jobspec_release(&s);
    }
    /* not given: 0 (the node's default share), and the normalized spec leaves it out */
    jobspec s;
    parse_ok(GOOD, &s);
    ck_assert_int_eq(s.resources.memory_mb, 0);
    char *j = NULL;
    ck_assert_int_eq(jobspec_to_json(&s, &j), 0);
    ck_assert_ptr_null(strstr(j, "memory"));
    free(j);
    parse_ok(TOP("'resources':{'memory':'1.5GiB'}"), &s);
    ck_assert_int_eq(jobspec_to_json(&s, &j), 0);
    ck_assert_ptr_nonnull(strstr(j, "\"memory\":\"1536MiB\""));
    free(j);
}
END_TEST

/* resources.evaluator: false by default and always in the normalized spec;
 * true for train and command jobs alike. */
START_TEST(test_evaluator_values) {
    jobspec s;
    char *j = NULL;
    parse_ok(GOOD, &s);
    ck_assert_int_eq(s.resources.evaluator, 0);
    ck_assert_int_eq(jobspec_to_json(&s, &j), 0);
    ck_assert_ptr_nonnull(strstr(j, "\"evaluator\":false"));
    free(j);
    jobspec_release(&s);
    parse_ok(TOP("'resources':{'evaluator':true}"), &s);
    ck_assert_int_eq(s.resources.evaluator, 1);
    ck_assert_int_eq(jobspec_to_json(&s, &j), 0);
    ck_assert_ptr_nonnull(strstr(j, "\"evaluator\":true"));
    free(j);
    jobspec_release(&s);
    parse_ok(TOP("'resources':{'evaluator':false}"), &s);
    ck_assert_int_eq(s.resources.evaluator, 0);
    jobspec_release(&s);
    parse_ok("{'command':{'argv':['x']},'resources':{'evaluator':true}}", &s);
    ck_assert_int_eq(s.kind, JOB_KIND_COMMAND);
    ck_assert_int_eq(s.resources.evaluator, 1);
    ck_assert_int_eq(jobspec_to_json(&s, &j), 0);
    ck_assert_ptr_nonnull(strstr(j, "\"evaluator\":true"));
    free(j);
    jobspec_release(&s);
}
END_TEST

/* parse(to_json(parse(x))) == parse(x), byte for byte; and to_json is a
 * fixed point after one round. */
static void round_trip(const char *doc, size_t len, const char *what) {
    jobspec a, b;
    spec_error e;
    ck_assert_msg(jobspec_parse(doc, len, &a, &e) == 0, "%s: %s", what, e.message);
    char *j1 = NULL, *j2 = NULL;
    ck_assert_int_eq(jobspec_to_json(&a, &j1), 0);
    ck_assert_msg(jobspec_parse(j1, strlen(j1), &b, &e) == 0, "%s: normalized spec refused: %s %s: "
                  "%s\n%s", what, e.code, e.field, e.message, j1);
    ck_assert_msg(memcmp(&a, &b, sizeof a) == 0, "%s: round trip differs\n%s", what, j1);
    ck_assert_int_eq(jobspec_to_json(&b, &j2), 0);
    ck_assert_str_eq(j1, j2);
    free(j1);
    free(j2);
}

/* Shapes flow through the convolutional layers as Keras computes them, with
 * their parameter counts (the numbers model.summary() prints for this model). */
START_TEST(test_cnn_shapes) {
    jobspec s;
    parse_ok(LAYERS(CNN_LAYERS), &s);
    ck_assert_int_eq(s.input_rank, 3); /* [28, 28] took one channel */
    ck_assert_int_eq(s.input_shape[2], 1);
    ck_assert_int_eq(s.input_size, 784);
    static const int want[9][4] = {{26, 26, 32}, {13, 13, 32}, {11, 11, 64}, {11, 11, 64}, {5, 5, 64},
                                   {1600}, {128}, {128}, {10}};
    static const int rank[9] = {3, 3, 3, 3, 3, 1, 1, 1, 1};
    static const long params[9] = {320, 0, 18496, 128, 0, 0, 204928, 0, 1290};
    for (int i = 0; i < 9; i++) {
        ck_assert_msg(s.layers[i].out_rank == rank[i], "layer %d rank %d", i, s.layers[i].out_rank);
        for (int d = 0; d < rank[i]; d++)
            ck_assert_msg(s.layers[i].out_shape[d] == want[i][d], "layer %d dim %d: %d, want %d", i, d,
                          s.layers[i].out_shape[d], want[i][d]);
        ck_assert_msg(s.layers[i].params == params[i], "layer %d params %ld want %ld", i,
                      s.layers[i].params, params[i]);
    }
    ck_assert_int_eq(s.layers[3].non_trainable, 128);
    ck_assert_int_eq(s.layers[4].strides[0], 2); /* pooling strides default to pool_size */
    cJSON *sum = jobspec_model_summary(&s);
    ck_assert_ptr_nonnull(sum);
    char *txt = cJSON_PrintUnformatted(sum);
    ck_assert_ptr_nonnull(txt);
    ck_assert_msg(strstr(txt, "\"total_params\":225290,\"trainable_params\":225162,"
                              "\"non_trainable_params\":128"), "%s", txt);
    ck_assert_msg(strstr(txt, "{\"name\":\"conv2d_1\",\"type\":\"conv2d\",\"output_shape\":[11,11,64],"
                              "\"params\":18496"), "%s", txt);
    free(txt);
    cJSON_Delete(sum);
    jobspec_release(&s);

    /* same padding with stride 2: ceil(in / s); the reshape's -1 inferred */
    parse_ok(LAYERS("{'type':'reshape','target_shape':[28,-1,1],'input_shape':[784]},"
                    "{'type':'conv2d','filters':3,'kernel_size':[5,3],'strides':[2,3],'padding':'same'},"
                    "{'type':'average_pooling2d','pool_size':[3,2],'strides':[1,2]},"
                    "{'type':'global_average_pooling2d'}," OUT10), &s);
    ck_assert_int_eq(s.layers[0].out_shape[1], 28);
    ck_assert_int_eq(s.layers[1].out_shape[0], 14);
    ck_assert_int_eq(s.layers[1].out_shape[1], 10);
    ck_assert_int_eq(s.layers[1].params, 5 * 3 * 1 * 3 + 3);
    ck_assert_int_eq(s.layers[2].out_shape[0], 12); /* (14 - 3) / 1 + 1 */
    ck_assert_int_eq(s.layers[2].out_shape[1], 5);  /* (10 - 2) / 2 + 1 */
    ck_assert_int_eq(s.layers[3].out_rank, 1);
    ck_assert_int_eq(s.layers[3].out_shape[0], 3);
    jobspec_release(&s);

    /* the messages give the shapes */
    spec_error e;
    ck_assert_int_eq(parse_q(LAYERS("{'type':'conv2d','filters':8,'kernel_size':29,'input_shape':[28,28]},"
                                    "{'type':'flatten'}," OUT10), &s, &e), -1);
    ck_assert_msg(strstr(e.message, "29x29") && strstr(e.message, "[28, 28, 1]"), "%s", e.message);
    ck_assert_int_eq(parse_q(LAYERS("{'type':'conv2d','filters':8,'kernel_size':3},{'type':'flatten'}," OUT10),
                             &s, &e), -1);
    ck_assert_msg(strstr(e.message, "gets [784]"), "%s", e.message);
}
END_TEST

START_TEST(test_round_trip) {
    for (int i = 0; i < N_GOOD; i++) {
        char *j = q(GOOD_SPECS[i]);
        char what[32];
        snprintf(what, sizeof what, "good spec %d", i);
        round_trip(j, strlen(j), what);
        free(j);
    }
    for (int i = 0; i < N_EXAMPLES; i++) {
        size_t len;
        char *doc = read_example(EXAMPLES[i], &len);
        round_trip(doc, len, EXAMPLES[i]);
        free(doc);
    }
}
END_TEST

START_TEST(test_to_json_content) {
    jobspec s;
    parse_ok(GOOD, &s);
    char *j = NULL;
    ck_assert_int_eq(jobspec_to_json(&s, &j), 0);
    static const char *const want[] = {
        "\"name\":\"job\"", "\"priority\":50", "\"learning_rate\":0.01",
        "\"input_shape\":[784]", "\"shuffle_buffer\":-1", "\"steps_per_epoch\":null",
        "\"gradient_accumulation_steps\":1}",
        "\"limit\":null", "\"strategy\":{\"type\":\"default\"}", "\"device\":\"cpu\"",
        "\"max_runtime_s\":86400", "\"max_restarts\":3", "\"metrics\":[]"};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        ck_assert_msg(strstr(j, want[i]) != NULL, "%s lacks %s", j, want[i]);
    free(j);
    /* floats print short: 0.001, not 0.0010000000474974513 */
    parse_ok(OPT("{'type':'rmsprop','learning_rate':0.001}"), &s);
    ck_assert_int_eq(jobspec_to_json(&s, &j), 0);
    ck_assert_ptr_nonnull(strstr(j, "\"learning_rate\":0.001,"));
    free(j);
}
END_TEST

/* fit.gradient_accumulation_steps: read, printed, read back; the
 * micro-batches of a job on fewer workers than resources.workers keep its
 * full size's micro-batch: steps x ceil(resources.workers / workers). */
START_TEST(test_gradient_accumulation) {
    jobspec s, back;
    parse_ok(TOP("'strategy':{'type':'multi_worker_mirrored'},'resources':{'workers':4},"
                 "'fit':{'batch_size':64,'gradient_accumulation_steps':2}"), &s);
    ck_assert_int_eq(s.fit.gradient_accumulation_steps, 2);
    char *j = NULL;
    ck_assert_int_eq(jobspec_to_json(&s, &j), 0);
    ck_assert_msg(strstr(j, "\"gradient_accumulation_steps\":2") != NULL, "%s", j);
    spec_error e;
    ck_assert_msg(jobspec_parse(j, strlen(j), &back, &e) == 0, "%s: %s", e.field, e.message);
    ck_assert_int_eq(back.fit.gradient_accumulation_steps, 2);
    free(j);
    const int workers[] = {4, 5, 3, 2, 1, 0, -1};
    const int want[] = {2, 2, 4, 4, 8, 8, 8};
    for (size_t i = 0; i < sizeof workers / sizeof workers[0]; i++)
        ck_assert_msg(jobspec_micro_batches(&s, workers[i]) == want[i], "%d workers: %d micro-batches, want %d",
                      workers[i], jobspec_micro_batches(&s, workers[i]), want[i]);
    /* as many micro-batches as rows per replica is allowed (one row each) */
    parse_ok(TOP("'strategy':{'type':'mirrored'},'resources':{'devices_per_worker':4},"
                 "'fit':{'batch_size':32,'gradient_accumulation_steps':8}"), &s);
    ck_assert_int_eq(jobspec_micro_batches(&s, 1), 8);
    /* a command job has no fit: one micro-batch */
    parse_ok("{'command':{'argv':['x']},'strategy':{'type':'multi_worker_mirrored'},'resources':{'workers':2}}",
             &s);
    ck_assert_int_eq(s.fit.gradient_accumulation_steps, 0);
    ck_assert_int_eq(jobspec_micro_batches(&s, 2), 1);
    ck_assert_int_eq(jobspec_micro_batches(&s, 1), 2);
    jobspec_release(&s);
}
END_TEST

/* A command job: argv, env and working_dir read whole, no training fields,
 * the common fields checked first; normalized and parsed again it is the
 * same job. */
/* ports on any job, an interactive job (no model, no command), its
 * idle_timeout as seconds or a duration, all printed and read back. */
START_TEST(test_ports_interactive) {
    jobspec s;
    parse_ok("{'command':{'argv':['python3','serve.py']},'ports':[{'name':'tensorboard','port':6006},"
             "{'name':'my-ui_2','port':65535},{'name':'web','port':1}]}", &s);
    ck_assert_int_eq(s.kind, JOB_KIND_COMMAND);
    ck_assert_int_eq(s.n_ports, 3);
    ck_assert_str_eq(s.ports[0].name, "tensorboard");
    ck_assert_int_eq(s.ports[0].port, 6006);
    ck_assert_str_eq(s.ports[1].name, "my-ui_2");
    ck_assert_int_eq(s.ports[2].port, 1);
    ck_assert_int_eq(s.interactive, INTERACTIVE_NONE);
    ck_assert_int_eq(s.idle_timeout_s, 0);
    char *j = NULL;
    ck_assert_int_eq(jobspec_to_json(&s, &j), 0);
    ck_assert_msg(strstr(j, "\"ports\":[{\"name\":\"tensorboard\",\"port\":6006},{\"name\":\"my-ui_2\","
                            "\"port\":65535},{\"name\":\"web\",\"port\":1}]") != NULL, "%s", j);
    ck_assert_ptr_null(strstr(j, "idle_timeout"));
    jobspec b; /* a command job holds pointers: its printed forms are compared */
    spec_error e;
    ck_assert_msg(jobspec_parse(j, strlen(j), &b, &e) == 0, "%s: %s", e.field, e.message);
    ck_assert_int_eq(b.n_ports, 3);
    ck_assert(memcmp(b.ports, s.ports, sizeof s.ports) == 0);
    char *j2 = NULL;
    ck_assert_int_eq(jobspec_to_json(&b, &j2), 0);
    ck_assert_str_eq(j, j2);
    free(j2);
    jobspec_release(&b);
    free(j);
    jobspec_release(&s);
    char env[64];
    jobspec_port_env("my-ui_2", env);
    ck_assert_str_eq(env, "TRAINYARD_PORT_MY_UI_2");
    jobspec_port_env("tensorboard", env);
    ck_assert_str_eq(env, "TRAINYARD_PORT_TENSORBOARD");
    ck_assert(jobspec_port_name_ok("a") && jobspec_port_name_ok("a-b_9"));
    ck_assert(!jobspec_port_name_ok("A") && !jobspec_port_name_ok("_a") && !jobspec_port_name_ok(""));

    /* a training job takes ports too; none printed when none */
    parse_ok(TOP("'ports':[{'name':'tb','port':6006}]"), &s);
    ck_assert_int_eq(s.kind, JOB_KIND_TRAIN);
    ck_assert_int_eq(s.n_ports, 1);
    parse_ok(GOOD, &s);
    ck_assert_int_eq(s.n_ports, 0);
    ck_assert_int_eq(jobspec_to_json(&s, &j), 0);
    ck_assert_ptr_null(strstr(j, "\"ports\""));
    free(j);

    /* a notebook: its own port "notebook", idle_timeout 1800 by default */
    parse_ok("{'name':'nb','interactive':{'type':'notebook'},'ports':[{'name':'tensorboard','port':6006}]}", &s);
    ck_assert_int_eq(s.kind, JOB_KIND_INTERACTIVE);
    ck_assert_int_eq(s.interactive, INTERACTIVE_NOTEBOOK);
    ck_assert_int_eq(s.idle_timeout_s, 1800);
    ck_assert_int_eq(s.n_ports, 2);
    ck_assert_str_eq(s.ports[0].name, "tensorboard");
    ck_assert_str_eq(s.ports[1].name, "notebook");
    ck_assert_int_eq(s.ports[1].port, 8888);
    ck_assert_int_eq(s.n_layers, 0);
    ck_assert_ptr_null(s.command.argv);
    ck_assert_int_eq(jobspec_to_json(&s, &j), 0);
    ck_assert_msg(strstr(j, "\"interactive\":{\"type\":\"notebook\"},\"idle_timeout\":1800") != NULL, "%s", j);
    ck_assert_msg(strstr(j, "{\"name\":\"notebook\",\"port\":8888}]") != NULL, "%s", j);
    ck_assert_ptr_null(strstr(j, "\"command\""));
    ck_assert_ptr_null(strstr(j, "\"model\""));
    round_trip(j, strlen(j), "a notebook job");
    free(j);
    /* the team's folder, as a command job's: in command.context, printed in interactive */
    parse_ok("{'interactive':{'type':'notebook','context':'sha256:" CTX64 "'}}", &s);
    ck_assert_str_eq(s.command.context, "sha256:" CTX64);
    ck_assert_int_eq(jobspec_to_json(&s, &j), 0);
    ck_assert_msg(strstr(j, "\"interactive\":{\"type\":\"notebook\",\"context\":\"sha256:" CTX64 "\"}") != NULL, "%s", j);
    ck_assert_ptr_null(strstr(j, "\"command\""));
    round_trip(j, strlen(j), "a notebook job with a context");
    free(j);
    /* its own port declared: kept as given, not twice */
    parse_ok("{'interactive':{'type':'notebook'},'ports':[{'name':'notebook','port':9999}]}", &s);
    ck_assert_int_eq(s.n_ports, 1);
    ck_assert_int_eq(s.ports[0].port, 9999);
    /* a shell has no port of its own; an image is allowed */
    parse_ok("{'interactive':{'type':'shell'},'environment':{'image':'docker.io/library/python:3.11'}}", &s);
    ck_assert_int_eq(s.interactive, INTERACTIVE_SHELL);
    ck_assert_int_eq(s.n_ports, 0);
    ck_assert_str_eq(s.environment.image, "docker.io/library/python:3.11");
    ck_assert_int_eq(jobspec_to_json(&s, &j), 0);
    round_trip(j, strlen(j), "a shell job in an image");
    free(j);

    /* a job with ports may be stopped when idle too (0 by default: never) */
    parse_ok("{'command':{'argv':['x']},'ports':[{'name':'web','port':80}],'idle_timeout':'15m'}", &s);
    ck_assert_int_eq(s.kind, JOB_KIND_COMMAND);
    ck_assert_int_eq(s.idle_timeout_s, 900);
    ck_assert_int_eq(jobspec_to_json(&s, &j), 0);
    ck_assert_msg(strstr(j, "\"port\":80}],\"idle_timeout\":900") != NULL, "%s", j);
    jobspec_release(&s);
    {
        jobspec b2;
        spec_error e2;
        ck_assert_msg(jobspec_parse(j, strlen(j), &b2, &e2) == 0, "%s: %s", e2.field, e2.message);
        ck_assert_int_eq(b2.idle_timeout_s, 900);
        jobspec_release(&b2);
    }
    free(j);

    /* idle_timeout: seconds, or a duration rounded up to a second */
    static const struct { const char *v; long s; } idle[] = {
        {"0", 0}, {"60", 60}, {"31536000", 31536000}, {"'30m'", 1800}, {"'15s'", 15}, {"'2h'", 7200},
        {"'1.5h'", 5400}, {"'1d'", 86400}, {"'0'", 0}, {"'0s'", 0}, {"'90'", 90}, {"'0.1s'", 1}, {"'365d'", 31536000}};
    for (size_t i = 0; i < sizeof idle / sizeof idle[0]; i++) {
        char spec[160];
        snprintf(spec, sizeof spec, "{'interactive':{'type':'shell'},'idle_timeout':%s}", idle[i].v);
        parse_ok(spec, &s);
        ck_assert_msg(s.idle_timeout_s == idle[i].s, "idle_timeout %s: %ld, not %ld", idle[i].v, s.idle_timeout_s,
                      idle[i].s);
        ck_assert_int_eq(jobspec_to_json(&s, &j), 0);
        round_trip(j, strlen(j), spec);
        free(j);
    }
}
END_TEST

START_TEST(test_command_parsed) {
    jobspec s, b;
    spec_error e;
    const char *spec = "{'name':'own','command':{'argv':['python3','train.py','--lr','0.1'],"
                       "'env':{'LR':'0.1','_X':'','OMP_NUM_THREADS':'1'},'working_dir':'team/a.b/./c'},"
                       "'strategy':{'type':'multi_worker_mirrored'},'resources':{'workers':2},"
                       "'max_runtime_s':600,'preemptible':true,'priority':7}";
    parse_ok(spec, &s);
    ck_assert_int_eq(s.kind, JOB_KIND_COMMAND);
    ck_assert_int_eq(s.command.argc, 4);
    ck_assert_str_eq(s.command.argv[0], "python3");
    ck_assert_str_eq(s.command.argv[3], "0.1");
    ck_assert_ptr_null(s.command.argv[4]);
    ck_assert_int_eq(s.command.n_env, 3);
    ck_assert_str_eq(s.command.env[0], "LR=0.1");
    ck_assert_str_eq(s.command.env[1], "_X=");
    ck_assert_ptr_null(s.command.env[3]);
    ck_assert_str_eq(s.command.working_dir, "team/a.b/./c");
    ck_assert_int_eq(s.resources.workers, 2);
    ck_assert_int_eq(s.strategy.type, STRAT_MULTI_WORKER_MIRRORED);
    ck_assert_int_eq(s.max_runtime_s, 600);
    ck_assert_int_eq(s.preemptible, 1);
    ck_assert_int_eq(s.priority, 7);
    ck_assert_int_eq(s.n_layers, 0);
    ck_assert_int_eq(s.fit.epochs, 0); /* the program decides: no epochs shown as progress */
    char *j1 = NULL, *j2 = NULL;
    ck_assert_int_eq(jobspec_to_json(&s, &j1), 0);
    ck_assert_ptr_null(strstr(j1, "\"model\""));
    ck_assert_ptr_null(strstr(j1, "\"fit\""));
    ck_assert_ptr_nonnull(strstr(j1, "\"working_dir\":\"team/a.b/./c\""));
    ck_assert_int_eq(jobspec_parse(j1, strlen(j1), &b, &e), 0);
    ck_assert_int_eq(b.command.argc, 4);
    ck_assert_int_eq(b.command.n_env, 3);
    for (int i = 0; i < 4; i++) ck_assert_str_eq(b.command.argv[i], s.command.argv[i]);
    for (int i = 0; i < 3; i++) ck_assert_str_eq(b.command.env[i], s.command.env[i]);
    ck_assert_int_eq(jobspec_to_json(&b, &j2), 0);
    ck_assert_str_eq(j1, j2);
    free(j1);
    free(j2);
    jobspec_release(&b);
    jobspec_release(&s);
    ck_assert_ptr_null(s.command.argv);
    /* no env, no working_dir; one worker on the default strategy */
    parse_ok("{'command':{'argv':['./run.sh']}}", &s);
    ck_assert_int_eq(s.command.n_env, 0);
    ck_assert_str_eq(s.command.working_dir, "");
    jobspec_release(&s);
    /* a failure leaves nothing to free, and the common fields come first */
    ck_assert_int_eq(parse_q("{'command':{'argv':['x'],'env':{'A':'1','RANK':'0'}}}", &s, &e), -1);
    ck_assert_ptr_null(s.command.argv);
    ck_assert_ptr_null(s.command.env);
    ck_assert_int_eq(parse_q("{'priority':5000,'command':{'argv':['x']}}", &s, &e), -1);
    ck_assert_str_eq(e.field, "priority");
    jobspec_release(&s); /* safe after a failure */
    ck_assert_int_eq(jobspec_env_reserved("TRAINYARD_ANYTHING"), 1);
    ck_assert_int_eq(jobspec_env_reserved("WORLD_SIZE"), 1);
    ck_assert_int_eq(jobspec_env_reserved("PATH"), 0);
    /* the command examples parse as they are, and survive their normal form */
    static const char *const CMD_EXAMPLES[] = {"ddp_train.json", "tf_config_check.json"};
    for (int i = 0; i < 2; i++) {
        size_t len;
        char *doc = read_example(CMD_EXAMPLES[i], &len);
        int rc = jobspec_parse(doc, len, &s, &e);
        ck_assert_msg(rc == 0, "%s: %s %s: %s", CMD_EXAMPLES[i], e.code, e.field, e.message);
        ck_assert_int_eq(s.kind, JOB_KIND_COMMAND);
        ck_assert_int_eq(s.resources.workers, 2);
        ck_assert_str_eq(s.command.argv[0], "/usr/bin/python3");
        ck_assert_int_eq(jobspec_to_json(&s, &j1), 0);
        ck_assert_int_eq(jobspec_parse(j1, strlen(j1), &b, &e), 0);
        ck_assert_int_eq(jobspec_to_json(&b, &j2), 0);
        ck_assert_str_eq(j1, j2);
        free(j1);
        free(j2);
        jobspec_release(&b);
        jobspec_release(&s);
        free(doc);
    }
}
END_TEST

START_TEST(test_names) {
    ck_assert_str_eq(act_name(ACT_SOFTMAX), "softmax");
    ck_assert_str_eq(act_name(ACT_LINEAR), "linear");
    ck_assert_str_eq(loss_name(LOSS_SPARSE_CATEGORICAL_CROSSENTROPY),
                     "sparse_categorical_crossentropy");
    ck_assert_str_eq(loss_name(LOSS_MSE), "mse");
    ck_assert_str_eq(opt_name(OPT_ADAGRAD), "adagrad");
    ck_assert_str_eq(strategy_name(STRAT_MULTI_WORKER_MIRRORED), "multi_worker_mirrored");
    ck_assert_str_eq(strategy_name(STRAT_PARAMETER_SERVER), "parameter_server");
    ck_assert_str_eq(device_kind_name(DEVICE_GPU), "gpu");
    ck_assert_str_eq(data_source_name(DATA_FASHION_MNIST), "fashion-mnist");
    ck_assert_str_eq(layer_type_name(LAYER_ACTIVATION), "activation");
    ck_assert_str_eq(init_name(INIT_HE_NORMAL), "he_normal");
    ck_assert_str_eq(comm_name(COMM_RING), "ring");
    ck_assert_str_eq(cdo_name(CDO_REDUCTION_TO_ONE_DEVICE), "reduction_to_one_device");
    ck_assert_str_eq(act_name((act_type)99), "?");
}
END_TEST

static Suite *jobspec_suite(void) {
    Suite *s = suite_create("jobspec");
    TCase *bad = tcase_create("bad");
    tcase_add_test(bad, test_bad_specs);
    tcase_add_test(bad, test_bad_specs_distinct);
    tcase_add_test(bad, test_messages);
    tcase_add_test(bad, test_unprintable_key);
    suite_add_tcase(s, bad);
    TCase *raw = tcase_create("raw");
    tcase_add_test(raw, test_depth_limit);
    tcase_add_test(raw, test_not_nul_terminated);
    tcase_add_test(raw, test_truncation_and_mutation);
    tcase_set_timeout(raw, 60);
    suite_add_tcase(s, raw);
    TCase *good = tcase_create("good");
    tcase_add_test(good, test_examples_parse);
    tcase_add_test(good, test_fashion_mlp_example);
    tcase_add_test(good, test_defaults);
    tcase_add_test(good, test_optimizer_defaults);
    tcase_add_test(good, test_good_specs);
    tcase_add_test(good, test_good_values);
    tcase_add_test(good, test_round_trip);
    tcase_add_test(good, test_memory_values);
    tcase_add_test(good, test_sizes_alike);
    tcase_add_test(good, test_size_parse);
    tcase_add_test(good, test_evaluator_values);
    tcase_add_test(good, test_to_json_content);
    tcase_add_test(good, test_gradient_accumulation);
    tcase_add_test(good, test_command_parsed);
    tcase_add_test(good, test_ports_interactive);
    tcase_add_test(good, test_names);
    tcase_add_test(good, test_cnn_shapes);
    suite_add_tcase(s, good);
    return s;
}

int main(void) {
    SRunner *sr = srunner_create(jobspec_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? 0 : 1;
}
