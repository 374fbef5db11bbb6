/* zt_train.c — being written */
